"""Pipelines, rounds and launches: the playbook's incremental tuning loop (002, "A scientific
approach to improving model performance"; docs/rounds.md).

A *pipeline* holds the configuration being improved: its objective, its trainer settings and the
*baseline* hyperparameters. A *round* holds one goal (`improve`, `understand` or `exploit`), the
studies run toward it (`studies.round_id`) and, at the end, a decision. Adopting a round's
candidate appends a *launch* and moves the baseline; nothing else changes it.

A study spec that names `round_id` starts from the pipeline (`expand_spec`): every baseline
hyperparameter the spec does not mention is fixed at the baseline's value (`source: "baseline"`),
the trainer settings default to the pipeline's, the objective is the pipeline's. Such studies are
otherwise ordinary: the worker, the analysis and the dashboard run them like any other.

Every public function takes the `Database` (or, where a caller composes it into its own
transaction, a `Session`) and plain values, answers JSON-ready dicts, and raises the service's
errors: `NotFound` for unknown ids, `InvalidInput` (422) naming the field, `Conflict` (409) saying
why the state refuses the call. Each call is one transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpo.policy import ExecutionPolicy
from hpo.server.db import Database
from hpo.server.errors import AlreadyExists, FieldError, InvalidInput
from hpo.server.models import Launch, Pipeline, Round, Study
from hpo.server.spec import workloads
from hpo.server.spec.parse import parse_spec
from hpo.server.spec.trainer import policy_errors
from hpo.server.studies.from_baseline import pipeline_or_404

ROUND_KINDS = ("improve", "understand", "exploit")


# --- pipelines -------------------------------------------------------------------------------------


def create_pipeline(db: Database, body: dict[str, Any], policy: ExecutionPolicy | None = None) -> dict[str, Any]:
    """Stores a pipeline. `body` is `{name, description?, objective?, trainer?, baseline: {params}}`
    (already shaped by the route's schema); the trainer and the baseline params are checked as a
    study made of them would be (`InvalidInput` naming `trainer.*` or `baseline.params.NAME`)."""
    name, params = body["name"], dict(body["baseline"]["params"])
    trainer = validated_trainer(name, body.get("objective") or {}, body.get("trainer") or {}, params, policy)
    objective = body.get("objective") or {}
    with db.transaction() as session:
        if session.scalar(select(Pipeline.id).where(Pipeline.name == name)) is not None:
            raise AlreadyExists(f"a pipeline named {name!r} already exists")
        row = Pipeline(
            name=name,
            description=body.get("description") or "",
            objective_metric=objective.get("metric", "valid/error_rate"),
            objective_mode=objective.get("mode", "min"),
            trainer=trainer,
            baseline_params=params,
        )
        session.add(row)
        session.flush()
        pipeline_id = row.id
    return get_pipeline(db, pipeline_id)


def validated_trainer(
    name: str,
    objective: dict[str, Any],
    trainer: dict[str, Any],
    params: dict[str, Any],
    policy: ExecutionPolicy | None,
) -> dict[str, Any]:
    """The trainer settings as stored (only the keys given), after checking them and the baseline
    params through the study spec's own rules: the study every round starts from must be valid."""
    raw = {
        "name": name,
        "objective": objective,
        "trainer": trainer,
        "hyperparameters": [{"name": k, "role": "fixed", "value": v} for k, v in params.items()],
    }
    try:
        spec = parse_spec(raw)
    except InvalidInput as exc:
        raise InvalidInput([_pipeline_field(e, list(params)) for e in exc.errors]) from None
    errors = policy_errors(spec, policy or ExecutionPolicy()) + workloads.workload_errors(spec)
    if errors:
        raise InvalidInput([_pipeline_field(e, list(params)) for e in errors])
    return dict(trainer)


def _pipeline_field(error: FieldError, names: list[str]) -> FieldError:
    """`hyperparameters[2].value` -> `baseline.params.momentum`; other fields keep their path."""
    if error.field.startswith("hyperparameters["):
        index = int(error.field[len("hyperparameters[") :].split("]", 1)[0])
        return FieldError(f"baseline.params.{names[index]}", error.reason)
    return error


def get_pipeline(db: Database, pipeline_id: int) -> dict[str, Any]:
    """`{id, name, description, objective, trainer, baseline, launches, rounds, created_at}`;
    `baseline` is `{params, trial_id, round_id, objective}`, `launches` every adoption in order."""
    with db.transaction() as session:
        row = pipeline_or_404(session, pipeline_id)
        launches = session.scalars(select(Launch).where(Launch.pipeline_id == row.id).order_by(Launch.id)).all()
        rounds = session.scalars(select(Round).where(Round.pipeline_id == row.id).order_by(Round.number)).all()
        return {
            **pipeline_summary(row),
            "launches": [launch_public(x) for x in launches],
            "rounds": [round_summary(session, r) for r in rounds],
        }


def list_pipelines(db: Database, *, limit: int = 100, offset: int = 0) -> dict[str, Any]:
    with db.transaction() as session:
        total = session.scalar(select(func.count()).select_from(Pipeline)) or 0
        rows = session.scalars(select(Pipeline).order_by(Pipeline.id.desc()).limit(limit).offset(offset)).all()
        items = []
        for row in rows:
            rounds = session.scalar(select(func.count()).where(Round.pipeline_id == row.id)) or 0
            launches = session.scalar(select(func.count()).where(Launch.pipeline_id == row.id)) or 0
            items.append({**pipeline_summary(row), "round_count": rounds, "launch_count": launches})
    return {"items": items, "total": total}


def pipeline_summary(row: Pipeline) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "description": row.description,
        "objective": {"metric": row.objective_metric, "mode": row.objective_mode},
        "trainer": row.trainer,
        "baseline": {
            "params": row.baseline_params,
            "trial_id": row.baseline_trial_id,
            "round_id": row.baseline_round_id,
            "objective": row.baseline_objective,
        },
        "created_at": row.created_at.isoformat(),
    }


def launch_public(row: Launch) -> dict[str, Any]:
    return {
        "id": row.id,
        "round_id": row.round_id,
        "trial_id": row.trial_id,
        "params_before": row.params_before,
        "params_after": row.params_after,
        "params_changed": params_changed(row.params_before, row.params_after),
        "objective_before": row.objective_before,
        "objective_after": row.objective_after,
        "evidence": row.evidence,
        "note": row.note,
        "created_at": row.created_at.isoformat(),
    }


def params_changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`{name: {before, after}}` for every hyperparameter a launch added, removed or changed."""
    names = sorted(set(before) | set(after))
    return {n: {"before": before.get(n), "after": after.get(n)} for n in names if before.get(n) != after.get(n)}


# --- rounds ----------------------------------------------------------------------------------------


def create_round(db: Database, pipeline_id: int, goal: str, kind: str) -> dict[str, Any]:
    """Opens the pipeline's next round (numbered 1, 2, ...) with one goal."""
    with db.transaction() as session:
        pipeline = pipeline_or_404(session, pipeline_id, lock=True)  # serializes the numbering
        last = session.scalar(select(func.max(Round.number)).where(Round.pipeline_id == pipeline.id)) or 0
        row = Round(pipeline_id=pipeline.id, number=last + 1, goal=goal, kind=kind)
        session.add(row)
        session.flush()
        return round_summary(session, row)


def round_studies(session: Session, round_id: int, role: str | None = None) -> list[Study]:
    """The round's studies in creation order: its own (`role` None) or its baseline reruns."""
    query = select(Study).where(Study.round_id == round_id)
    query = query.where(Study.round_role.is_(None) if role is None else Study.round_role == role)
    return list(session.scalars(query.order_by(Study.id)))


def round_summary(session: Session, row: Round) -> dict[str, Any]:
    studies = round_studies(session, row.id)
    return {
        "id": row.id,
        "pipeline_id": row.pipeline_id,
        "number": row.number,
        "goal": row.goal,
        "kind": row.kind,
        "status": "decided" if row.decision is not None else "open",
        "decision": row.decision,
        "study_ids": [s.id for s in studies],
        "created_at": row.created_at.isoformat(),
    }
