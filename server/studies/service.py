"""Studies: creation (validation and trial layout in one transaction), reading, pausing, growing.

Every public function takes the `Database` and plain values, returns schema value types, and
raises the service's errors (`InvalidInput`, `NotFound`, `AlreadyExists`, `Conflict`)."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import LargeBinary, Select, Text, cast, func, insert, select, text
from sqlalchemy.orm import Session, defer

from hpo.policy import ExecutionPolicy
from hpo.server.analysis.judged import study_best
from hpo.server.bayesian.start import bayesian_start
from hpo.server.db import Database
from hpo.server.errors import AlreadyExists, FieldError, InvalidInput, NotFound
from hpo.server.layout import manual
from hpo.server.layout import quasi_random as layout
from hpo.server.models import Study, StudyStatus, Trial, TrialStatus
from hpo.server.schemas import (
    ManualTrialIn,
    Page,
    StudyCreated,
    StudyListItem,
    StudyPatch,
    StudyPublic,
    TrialCounts,
    Warning,
)
from hpo.server.spec import advice, trainer, workloads
from hpo.server.spec.model import StudySpec, arm_count
from hpo.server.spec.parse import parse_spec
from hpo.server.studies.from_baseline import expand_spec

MAX_TRIALS_PER_STUDY = 100_000


def create_study(db: Database, raw_spec: object, policy: ExecutionPolicy | None = None) -> StudyCreated:
    """Validates the spec, stores the study and lays out its trials in one transaction, and
    answers with the design checks as warnings (they never refuse the study). `policy` is the
    operator's allow-list (default: built-in workloads only); a study naming anything else is refused.
    A spec naming `round_id` starts from its pipeline's baseline (`from_baseline.expand_spec`), read in
    the same transaction."""
    with db.transaction() as session:
        _ensure_raw_name_free(session, raw_spec)
    if isinstance(raw_spec, dict) and raw_spec.get("round_id") is not None:
        with db.transaction() as session:
            spec, study_id = create_in_round(session, raw_spec, policy)
    else:
        spec, drafts = _prepared(raw_spec, policy)
        with db.transaction() as session:
            study_id = _store(session, spec, drafts)
    warnings = [Warning(**w) for w in advice.design_warnings(spec) + workloads.workload_warnings(spec)]
    # A new study has no finished trial, so no best one: not judging it spares loading every trial.
    return StudyCreated(**get_study(db, study_id, best=False).model_dump(), warnings=warnings)


def create_in_round(
    session: Session, raw_spec: dict[str, Any], policy: ExecutionPolicy | None, role: str | None = None
) -> tuple[StudySpec, int]:
    """Creates a round's study inside the caller's transaction (study creation, recipes, a round's
    baseline reruns, which pass `role="baseline"`): the spec expanded from the pipeline, then
    checked and laid out as any other."""
    _ensure_raw_name_free(session, raw_spec)
    raw, round_row = expand_spec(session, raw_spec)
    spec, drafts = _prepared(raw, policy)
    study_id = _store(session, spec, drafts)
    study = session.get_one(Study, study_id)
    study.round_id, study.round_role = round_row.id, role
    return spec, study_id


def _prepared(raw_spec: object, policy: ExecutionPolicy | None) -> tuple[StudySpec, list[layout.TrialDraft] | None]:
    """The checked spec, and its manual trials' drafts (None: laid out while stored, `_store`)."""
    spec = parse_spec(raw_spec)
    refused = trainer.policy_errors(spec, policy or ExecutionPolicy())
    if refused:
        raise InvalidInput(refused)
    typos = workloads.workload_errors(spec)
    if typos:
        raise InvalidInput(typos)
    costly = cost_errors(spec)
    if costly:
        raise InvalidInput(costly)
    return spec, _initial_drafts(spec)


def _store(session: Session, spec: StudySpec, drafts: list[layout.TrialDraft] | None) -> int:
    _ensure_name_free(session, spec.name)
    study = _new_study_row(spec)
    session.add(study)
    session.flush()
    if spec.algorithm == "bayesian":  # initial trials and the proposal queue (docs/bayesian.md)
        drafts = bayesian_start(session, study.id, spec)
    if drafts is None:
        study.next_point_index = _lay_out(session, study, spec, 0, spec.num_trials, first_number=0)
    else:
        _insert_trials(session, study, drafts, first_number=0)
        study.next_point_index = _next_point_index(drafts, 0)
    return study.id


# --- what a spec may cost ----------------------------------------------------------------------

# A spec's cost is its layout: each trial holds a value of every hyperparameter that applies to it,
# laid out, encoded and stored, about 3 us of CPU a value. A 79 KB body (1,000 floats x 1,000
# trials) took 2.8 s of CPU and 240 MB, and the 100,000-trial cap alone allowed 100 million values
# (docs/security.md, "Hostile input"). So the values a layout holds (trials x hyperparameters,
# `max_spec_cells`) and the values the spec lists (`MAX_SPEC_VALUES`) are bounded, and trials are laid
# out and stored a chunk at a time (`layout.layout_chunks`), so memory stays flat whatever the count.
MAX_SPEC_CELLS = 2_000_000
MAX_SPEC_VALUES = 100_000
_limits = {"cells": MAX_SPEC_CELLS}


def configure(max_spec_cells: int) -> None:
    """Sets `HPO_MAX_SPEC_CELLS` from the server's settings (`create_app` calls this)."""
    _limits["cells"] = max_spec_cells


def max_spec_cells() -> int:
    return _limits["cells"]


def cost_errors(spec: StudySpec, num_trials: int | None = None) -> list[FieldError]:
    """Why laying out `spec` (with `num_trials` points, default its own) would cost too much."""
    errors = []
    listed = sum(len(hp.values or []) for hp in spec.hyperparameters)
    if listed > MAX_SPEC_VALUES:
        errors.append(
            FieldError(
                "hyperparameters",
                f"list {listed} values in all (categorical and discrete), over the limit of {MAX_SPEC_VALUES}",
            )
        )
        return errors  # crossing that many values into arms is itself the cost
    if spec.algorithm == "bayesian":
        return errors  # proposed a few at a time by the queue, never laid out at once
    points = spec.num_trials if num_trials is None else num_trials
    n_arms = len(layout.arms(spec)) if spec.algorithm != "manual" else 1
    trials = len(spec.trials or []) if spec.algorithm == "manual" else points * n_arms
    cells = trials * max(1, len(spec.hyperparameters))
    limit = max_spec_cells()
    if cells > limit:
        errors.append(
            FieldError(
                "num_trials" if spec.algorithm != "manual" else "trials",
                f"{trials} trials x {len(spec.hyperparameters)} hyperparameters is {cells} values to lay out, "
                f"over the limit of {limit} (HPO_MAX_SPEC_CELLS); run fewer trials or tune fewer hyperparameters",
            )
        )
    return errors


def _lay_out(session: Session, study: Study, spec: StudySpec, start: int, count: int, *, first_number: int) -> int:
    """Lays out and stores points `start … start+count-1` a chunk at a time (`layout.layout_chunks`:
    the trials one layout would give, never all in memory at once); answers the next point index."""
    number, next_index = first_number, start
    for drafts in layout.layout_chunks(spec, start, count):
        _insert_trials(session, study, drafts, first_number=number, ids=False, analyze=False)
        number += len(drafts)
        next_index = _next_point_index(drafts, next_index)
    if number > first_number and session.get_bind().dialect.name == "postgresql":
        session.execute(text("ANALYZE trials"))  # once, after the bulk load (`_copy_trials`)
    return next_index


def get_study(db: Database, study_id: int, *, best: bool = True) -> StudyPublic:
    """The study's public view. With `best` False, `best_trial_id` and `best_value` are None and
    the divergence judgement that decides them is not run (the study page's HTML, which does not
    show them, answers at once on a first visit instead of waiting for it)."""
    with db.transaction() as session:
        study = _study_or_404(session, study_id)
        return _public(session, study, best=best)


def get_study_in(session: Session, study_id: int) -> StudyPublic:
    """`get_study` inside the caller's transaction."""
    return _public(session, _study_or_404(session, study_id))


def trial_ids(session: Session, study_id: int) -> list[int]:
    """The study's trial ids in trial-number order."""
    return list(session.scalars(select(Trial.id).where(Trial.study_id == study_id).order_by(Trial.number)))


# A list answers each study's spec inline only up to this size of its JSON text (as the database
# holds it): a spec may be up to HPO_MAX_BODY_BYTES (32 MiB), and a page of a thousand studies must
# stay small. A larger spec is null in the list, with `spec_truncated`; GET /api/v1/studies/{id}
# answers it whole (docs/api.md, "Studies").
LIST_SPEC_BYTES = 64 * 1024


def list_studies(db: Database, *, status: str | None = None, limit: int = 100, offset: int = 0) -> Page:
    """A page of studies (`StudyListItem`), newest first. Filtering and paging happen in SQL: only
    the page's rows are loaded, however many studies there are, and of their specs only those
    within `LIST_SPEC_BYTES` (sizes are measured in the database)."""
    with db.transaction() as session:
        query: Select[Any] = select(Study.id)
        if status is not None:
            query = query.where(_status_condition(status))
        total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        ids = query.order_by(Study.id.desc()).limit(limit).offset(offset)
        page = session.scalars(select(Study).options(defer(Study.spec)).where(Study.id.in_(ids))).all()
        size = _spec_bytes(session)
        sizes = {int(i): int(n or 0) for i, n in session.execute(select(Study.id, size).where(Study.id.in_(ids)))}
        small = [i for i, n in sizes.items() if n <= LIST_SPEC_BYTES]
        specs: dict[int, Any] = {
            int(row[0]): row[1] for row in session.execute(select(Study.id, Study.spec).where(Study.id.in_(small)))
        }
        views = [
            StudyListItem(
                **_view_fields(session, s),
                spec=specs.get(s.id),
                spec_bytes=sizes.get(s.id, 0),
                spec_truncated=s.id not in specs,
            )
            for s in sorted(page, key=lambda s: -s.id)
        ]
    return Page(items=views, total=total)


def _spec_bytes(session: Session) -> Any:
    """The size in bytes of a study's spec as its database holds its JSON text."""
    if session.get_bind().dialect.name == "postgresql":
        return func.octet_length(cast(Study.spec, Text))
    return func.length(cast(Study.spec, LargeBinary))


def _status_condition(status: str) -> Any:
    """The effective status (`_effective_status`) as SQL: an active study whose trials have all
    finished reads `completed`."""
    has_trials = select(Trial.id).where(Trial.study_id == Study.id).exists()
    unfinished = (
        select(Trial.id)
        .where(Trial.study_id == Study.id, Trial.status.in_([TrialStatus.pending, TrialStatus.running]))
        .exists()
    )
    done = has_trials & ~unfinished
    if status == "completed":
        return (Study.status == StudyStatus.active) & done
    if status == "active":
        return (Study.status == StudyStatus.active) & ~done
    return Study.status == StudyStatus(status)


def patch_study(db: Database, study_id: int, patch: StudyPatch) -> StudyPublic:
    """Pauses, resumes or archives a study, and raises `num_trials` by continuing the
    quasi-random sequence: trials already laid out never change."""
    with db.transaction() as session:
        study = _study_or_404(session, study_id, lock=True)
        if patch.num_trials is not None and patch.num_trials != study.num_trials:
            _grow(session, study, patch.num_trials)
        if patch.status is not None:
            study.status = StudyStatus(patch.status)
            if study.status is StudyStatus.active:
                study.consecutive_errors = 0
    return get_study(db, study_id)


def add_manual_trials(db: Database, study_id: int, trials: Sequence[ManualTrialIn]) -> list[int]:
    """Adds user-listed trials to any study; their params are checked against the study's space."""
    with db.transaction() as session:
        study = _study_or_404(session, study_id, lock=True)
        spec = parse_spec(study.spec)
        raw = [t.model_dump(exclude_none=True) for t in trials]
        drafts = manual.manual_drafts(spec, raw)
        ensure_room(session, study.id, len(drafts), "trials")
        first = _next_number(session, study.id)
        return _insert_trials(session, study, drafts, first_number=first)


def study_spec(db: Database, study_id: int) -> StudySpec:
    with db.transaction() as session:
        return parse_spec(_study_or_404(session, study_id).spec)


def ensure_room(session: Session, study_id: int, adding: int, field: str) -> None:
    """The cap of MAX_TRIALS_PER_STUDY holds on every path that adds trials (growth, manual
    trials, replicas), counting what the study already has. Callers hold the study's row lock."""
    have = session.scalar(select(func.count()).select_from(Trial).where(Trial.study_id == study_id)) or 0
    if have + adding > MAX_TRIALS_PER_STUDY:
        raise InvalidInput.one(
            field, f"would bring the study to {have + adding} trials, over the limit of {MAX_TRIALS_PER_STUDY}"
        )


def _initial_drafts(spec: StudySpec) -> list[layout.TrialDraft] | None:
    if spec.algorithm == "manual":
        return manual.manual_drafts(spec, [t.model_dump(exclude_none=True) for t in spec.trials or []])
    if spec.algorithm == "bayesian":
        return []  # laid out by bayesian_start, which needs the database (warm start)
    return None  # laid out while stored, a chunk at a time (`_lay_out`)


def grow(session: Session, study_id: int, num_trials: int) -> None:
    """Raises a study's `num_trials` inside the caller's transaction (a round's baseline reruns)."""
    _grow(session, _study_or_404(session, study_id, lock=True), num_trials)


def _grow(session: Session, study: Study, num_trials: int) -> None:
    if num_trials < study.num_trials:
        raise InvalidInput.one("num_trials", f"can only grow (it is {study.num_trials}); cancel trials instead")
    if study.algorithm == "bayesian":  # a larger budget: the queue proposes the rest
        study.num_trials = num_trials
        study.spec = {**study.spec, "num_trials": num_trials}
        return
    if study.algorithm not in ("halton", "random"):
        raise InvalidInput.one(
            "num_trials", f"cannot grow a {study.algorithm} study; add trials with POST .../trials instead"
        )
    spec = parse_spec(study.spec)
    n_arms = len(layout.arms(spec))
    if num_trials * n_arms > MAX_TRIALS_PER_STUDY:
        raise InvalidInput.one("num_trials", f"{num_trials} x {n_arms} arms exceeds {MAX_TRIALS_PER_STUDY} trials")
    ensure_room(session, study.id, (num_trials - study.num_trials) * n_arms, "num_trials")
    costly = cost_errors(spec, num_trials)
    if costly:
        raise InvalidInput(costly)
    study.next_point_index = _lay_out(
        session,
        study,
        spec,
        study.next_point_index,
        num_trials - study.num_trials,
        first_number=_next_number(session, study.id),
    )
    study.num_trials = num_trials
    study.spec = {**study.spec, "num_trials": num_trials}


def _insert_trials(
    session: Session,
    study: Study,
    drafts: Iterable[layout.TrialDraft],
    *,
    first_number: int,
    ids: bool = True,
    analyze: bool = True,
) -> list[int]:
    """Stores drafts as trials numbered from `first_number`; answers their ids (unless `ids` is
    False). `analyze`: ANALYZE after the COPY on Postgres (the last chunk of a layout)."""
    rows = [
        {
            "study_id": study.id,
            "number": first_number + i,
            "arm": d.arm,
            "params": d.params,
            "point_index": d.point_index,
            "unit_point": d.unit_point,
            "seed": d.seed,
            "replica_index": d.replica_index,
            "status": TrialStatus.pending,
            "attempt": 0,
            "failures": 0,
            "restart_after_attempt": 0,
            "point_count": 0,  # COPY applies no column default: NULL would mean "from before counting"
        }
        for i, d in enumerate(drafts)
    ]
    if not rows:
        return []
    if session.get_bind().dialect.name == "postgresql":
        _copy_trials(session, rows, analyze=analyze)
    else:
        session.execute(insert(Trial), rows)
    if not ids:
        return []
    numbers = select(Trial.id).where(Trial.study_id == study.id, Trial.number >= first_number).order_by(Trial.number)
    return list(session.scalars(numbers))


_JSON_COLUMNS = ("arm", "params", "unit_point")


def _copy_trials(session: Session, rows: list[dict[str, Any]], *, analyze: bool = True) -> None:
    """COPY into trials inside the session's transaction: a 10,000-trial study costs one round
    trip instead of 10,000 INSERTs (or one huge multi-VALUES statement).

    Then ANALYZE, as Postgres advises after a bulk load ("Populating a Database"): until
    autovacuum gets to it, the planner believes the table holds a few rows and plans the claim
    as a sort of every pending trial (1.2 ms a claim at 10,000 trials) instead of a walk of the
    pending index that stops at the first unlocked row (0.05 ms). Inside the transaction ANALYZE
    counts our own uncommitted rows, and its lock does not block claims or ingest."""
    columns = list(rows[0])
    driver: Any = session.connection().connection.driver_connection
    with driver.cursor() as cursor:
        with cursor.copy(f"COPY trials ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([_copy_value(column, row[column]) for column in columns])
        if analyze:
            cursor.execute("ANALYZE trials")


def _copy_value(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _JSON_COLUMNS:
        return json.dumps(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _next_point_index(drafts: Sequence[layout.TrialDraft], current: int) -> int:
    indexes = [d.point_index for d in drafts if d.point_index is not None]
    return max(indexes) + 1 if indexes else current


def _next_number(session: Session, study_id: int) -> int:
    last = session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study_id))
    return 0 if last is None else last + 1


def _new_study_row(spec: StudySpec) -> Study:
    resources = spec.resources
    return Study(
        name=spec.name,
        description=spec.description,
        goal=spec.goal,
        status=StudyStatus.active,
        algorithm=spec.algorithm,
        seed=spec.seed,
        num_trials=spec.num_trials,
        next_point_index=0,
        spec=spec.model_dump(mode="json"),
        objective_metric=spec.objective.metric,
        objective_mode=spec.objective.mode,
        cpus_needed=resources.workers * resources.cpus_per_worker,
        gpus_needed=resources.workers * resources.gpus_per_worker,
        max_attempts=spec.max_attempts,
        max_failed_trials=spec.max_failed_trials,
        consecutive_errors=0,
    )


def _study_or_404(session: Session, study_id: int, *, lock: bool = False) -> Study:
    query = select(Study).where(Study.id == study_id)
    if lock:
        query = query.with_for_update()
    study = session.scalar(query)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    return study


def _ensure_raw_name_free(session: Session, raw_spec: object) -> None:
    """A taken name is refused before the spec is parsed or a trial laid out (both take seconds for
    100,000 listed trials), so the 409 costs one query whatever the spec's size. `_store` checks
    again, in the transaction that inserts."""
    name = raw_spec.get("name") if isinstance(raw_spec, dict) else None
    if isinstance(name, str):
        _ensure_name_free(session, name)


def _ensure_name_free(session: Session, name: str) -> None:
    if session.scalar(select(Study.id).where(Study.name == name)) is not None:
        raise AlreadyExists(f"a study named {name!r} already exists")


def _public(session: Session, study: Study, *, best: bool = True) -> StudyPublic:
    return StudyPublic(**_view_fields(session, study, best=best), spec=study.spec)


def _view_fields(session: Session, study: Study, *, best: bool = True) -> dict[str, Any]:
    """A study's public fields but its spec."""
    counts = dict(
        session.execute(
            select(Trial.status, func.count()).where(Trial.study_id == study.id).group_by(Trial.status)
        ).all()
    )
    trial_counts = TrialCounts(**{status.value: n for status, n in counts.items()})
    best_trial = _best_trial(session, study) if best else None
    status = _effective_status(study, trial_counts)
    return dict(
        status_reason=status_reason(session, study) if status == "paused" else None,
        id=study.id,
        name=study.name,
        description=study.description,
        goal=study.goal,
        status=status,
        algorithm=study.algorithm,
        seed=study.seed,
        num_trials=study.num_trials,
        objective={"metric": study.objective_metric, "mode": study.objective_mode},
        trial_counts=trial_counts,
        best_trial_id=best_trial[0] if best_trial else None,
        best_value=best_trial[1] if best_trial else None,
        created_at=study.created_at.isoformat(),
    )


def status_reason(session: Session, study: Study) -> str:
    """Why a paused study is paused: it paused itself after `max_failed_trials` failures in a row
    (docs/api.md, "GET /api/v1/studies/{id}"), with the last failure's reason, or a person paused it."""
    if study.consecutive_errors < study.max_failed_trials:
        return "paused by a person (PATCH status=paused, or hpo study pause); resume with status=active"
    last = session.execute(
        select(Trial.id, Trial.error)
        .where(Trial.study_id == study.id, Trial.error.is_not(None))
        .order_by(Trial.finished_at.desc().nulls_last(), Trial.id.desc())
        .limit(1)
    ).first()
    cause = "" if last is None else f"; the last, trial {last[0]}: {str(last[1]).splitlines()[0][:300]}"
    return (
        f"paused itself after {study.consecutive_errors} failed trials in a row (max_failed_trials "
        f"{study.max_failed_trials}){cause}. Fix the cause, retry the failed trials, then set status=active"
    )


def _best_trial(session: Session, study: Study) -> tuple[int, float] | None:
    # The analysis decides (analysis.judged.study_best): replicas never, diverged trials and
    # lone outlier evaluations never, so the page, the CSV and the analysis name the same trial.
    best = study_best(session, study.id)
    return (best.id, float(best.objective)) if best is not None and best.objective is not None else None


def _effective_status(study: Study, counts: TrialCounts) -> Any:
    """A study whose trials have all finished reads `completed`; stored status is unchanged."""
    unfinished = counts.pending + counts.running
    total = unfinished + counts.completed + counts.infeasible + counts.failed + counts.cancelled
    if study.algorithm == "bayesian" and total < study.num_trials * arm_count(StudySpec.model_validate(study.spec)):
        return study.status.value  # between proposals: the queue has not proposed the whole budget yet
    if study.status is StudyStatus.active and total > 0 and unfinished == 0:
        return "completed"
    return study.status.value
