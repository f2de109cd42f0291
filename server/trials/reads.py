"""Reading trials, their metrics and checkpoints, and adding replicas of a trial."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from hpo.server.analysis.rules.unread import trial_warnings
from hpo.server.db import Database
from hpo.server.errors import Conflict, NotFound
from hpo.server.layout import quasi_random as layout
from hpo.server.models import Checkpoint, MetricPoint, Study, StudyStatus, Trial, TrialStatus, resumed
from hpo.server.numbers import from_storage, to_json
from hpo.server.schemas import CheckpointPublic, MetricPointPublic, Page, TrialPublic
from hpo.server.studies import service as studies

TrialOrder = Literal["number", "objective", "-number"]


def get_trial(db: Database, trial_id: int) -> TrialPublic:
    with db.transaction() as session:
        return trial_public(_trial_or_404(session, trial_id))


def list_trials(
    db: Database,
    study_id: int,
    *,
    status: str | None = None,
    order_by: TrialOrder = "number",
    limit: int = 100,
    offset: int = 0,
) -> Page:
    """A page of a study's trials. `objective` orders best first in the study's mode, trials
    without an objective last."""
    with db.transaction() as session:
        study = session.get(Study, study_id)
        if study is None:
            raise NotFound(f"study {study_id} not found")
        query = select(Trial).where(Trial.study_id == study_id)
        if status is not None:
            query = query.where(Trial.status == TrialStatus(status))
        total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        query = query.order_by(*_ordering(study, order_by)).limit(limit).offset(offset)
        return Page(items=[trial_public(t) for t in session.scalars(query)], total=total)


def list_metrics(db: Database, trial_id: int, *, name: str | None = None, limit: int = 10_000, offset: int = 0) -> Page:
    with db.transaction() as session:
        _trial_or_404(session, trial_id)
        query = select(MetricPoint).where(MetricPoint.trial_id == trial_id)
        if name is not None:
            query = query.where(MetricPoint.name == name)
        total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = session.scalars(query.order_by(MetricPoint.name, MetricPoint.step).limit(limit).offset(offset))
        items = [MetricPointPublic.of(p.step, p.name, from_storage(p.value, p.nonfinite)) for p in rows]
        return Page(items=items, total=total)


def list_checkpoints(db: Database, trial_id: int) -> list[CheckpointPublic]:
    """The trial's checkpoint records, best objective first (the retrospective selection)."""
    with db.transaction() as session:
        trial = _trial_or_404(session, trial_id)
        study = session.get_one(Study, trial.study_id)
        order = Checkpoint.objective.asc() if study.objective_mode == "min" else Checkpoint.objective.desc()
        rows = session.scalars(
            select(Checkpoint).where(Checkpoint.trial_id == trial_id).order_by(order.nulls_last(), Checkpoint.step)
        )
        return [
            CheckpointPublic(
                id=c.id, trial_id=c.trial_id, attempt=c.attempt, step=c.step, uri=c.uri, objective=to_json(c.objective)
            )
            for c in rows
        ]


def create_replicas(db: Database, trial_id: int, count: int) -> list[int]:
    """Reruns a trial's params with new seeds so trial variance can be measured (playbook:
    "Identifying bad runs ... retrain variance"). Replicas record `replica_of`."""
    with db.transaction() as session:
        return add_replicas(session, trial_id, count)


def add_replicas(session: Session, trial_id: int, count: int) -> list[int]:
    """`create_replicas` inside the caller's transaction (a round's replicas add the baseline's in
    the same one)."""
    original = _trial_or_404(session, trial_id)
    source_id = original.replica_of or original.id
    study = session.get_one(Study, original.study_id, with_for_update=True)
    studies.ensure_room(session, study.id, count, "count")
    existing = (
        session.scalar(
            select(func.max(Trial.replica_index)).where((Trial.id == source_id) | (Trial.replica_of == source_id))
        )
        or 0
    )
    last_number = session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study.id)) or 0
    used = set(session.scalars(select(Trial.seed).where(Trial.study_id == study.id)))
    # A point index of 0 is a real point (not "missing"); a trial without one (laid out by no
    # sequence) draws from indices no sequence reaches.
    point = original.point_index if original.point_index is not None else 2**31 + original.number
    rows: list[dict[str, Any]] = []
    for i in range(1, count + 1):
        replica_index = existing + i
        seed = replica_seed(study.seed, point, replica_index, used)
        used.add(seed)
        rows.append(
            {
                "study_id": study.id,
                "number": last_number + i,
                "arm": original.arm,
                "params": original.params,
                "point_index": original.point_index,
                "unit_point": original.unit_point,
                "seed": seed,
                "replica_of": source_id,
                "replica_index": replica_index,
                "status": TrialStatus.pending,
                "attempt": 0,
                "failures": 0,
                "restart_after_attempt": 0,
            }
        )
    return list(session.scalars(insert(Trial).returning(Trial.id, sort_by_parameter_order=True), rows))


def retry(db: Database, trial_id: int) -> list[int]:
    """Runs a failed trial again as a new trial with the same params and seed (Optuna's
    `RetryFailedTrialCallback` does the same): the failed one stays as it was (finished trials never
    change), and the new one gets a fresh attempt budget. For a trial failed because a worker's
    allow-list refused it, once the operator allowed it. 409 for a trial that did not fail."""
    with db.transaction() as session:
        trial = _trial_or_404(session, trial_id)
        if trial.status is not TrialStatus.failed:
            raise Conflict(f"trial {trial_id} is {trial.status.value}; only a failed trial can be retried")
        study = session.get_one(Study, trial.study_id, with_for_update=True)
        return _add_retries(session, study, [trial])


def retry_study(db: Database, study_id: int, kind: str | None = None) -> list[int]:
    """Retries every failed trial of a study that has not been retried yet (of one `fail_kind`
    when given), and resumes a study that paused itself over those failures."""
    with db.transaction() as session:
        study = session.get(Study, study_id, with_for_update=True)
        if study is None:
            raise NotFound(f"study {study_id} not found")
        query = select(Trial).where(Trial.study_id == study_id, Trial.status == TrialStatus.failed)
        if kind is not None:
            query = query.where(Trial.fail_kind == kind)
        failed = list(session.scalars(query.order_by(Trial.number)))
        ids = _add_retries(session, study, failed)
        if ids and study.status is StudyStatus.paused and study.consecutive_errors >= study.max_failed_trials:
            study.status, study.consecutive_errors = StudyStatus.active, 0
        return ids


def _add_retries(session: Session, study: Study, failed: list[Trial]) -> list[int]:
    retried = set(
        session.scalars(select(Trial.retry_of).where(Trial.study_id == study.id, Trial.retry_of.is_not(None)))
    )
    failed = [t for t in failed if t.id not in retried]
    if not failed:
        return []
    studies.ensure_room(session, study.id, len(failed), "trials")
    last_number = session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study.id)) or 0
    rows = [
        {
            "study_id": study.id,
            "number": last_number + i + 1,
            "arm": t.arm,
            "params": t.params,
            "point_index": t.point_index,
            "unit_point": t.unit_point,
            "seed": t.seed,
            "replica_of": t.replica_of,
            "replica_index": t.replica_index,
            "retry_of": t.id,
            "status": TrialStatus.pending,
            "attempt": 0,
            "failures": 0,
            "restart_after_attempt": 0,
        }
        for i, t in enumerate(failed)
    ]
    return list(session.scalars(insert(Trial).returning(Trial.id, sort_by_parameter_order=True), rows))


def replica_seed(study_seed: int, point: int, replica_index: int, used: set[int]) -> int:
    """The seed of a replica: `layout.trial_seed` of its point and replica index, redrawn (with a
    deterministic salt) until it differs from every seed already in the study, so a replica never
    repeats another trial's run (31-bit seeds collide by chance once a study holds tens of
    thousands of trials)."""
    salt = 0
    while True:
        seed = layout.trial_seed(study_seed, point, replica_index + salt * 2**32)
        if seed not in used:
            return seed
        salt += 1


def trial_public(trial: Trial) -> TrialPublic:
    return TrialPublic(
        id=trial.id,
        study_id=trial.study_id,
        number=trial.number,
        arm=trial.arm,
        status=trial.status.value,
        params=trial.params,
        seed=trial.seed,
        point_index=trial.point_index,
        replica_of=trial.replica_of,
        retry_of=trial.retry_of,
        attempt=trial.attempt,
        objective_value=trial.objective_value,
        best_step=trial.best_step,
        resumed=resumed(trial.best_step, trial.resumed_from_step),
        fail_kind=trial.fail_kind,
        error=trial.error,
        error_step=trial.error_step,
        worker_id=trial.worker_id,
        unread_params=trial.unread_params,
        warnings=trial_warnings(trial.unread_params),
    )


def _ordering(study: Study, order_by: TrialOrder) -> list[Any]:
    if order_by == "objective":
        value = Trial.objective_value.asc() if study.objective_mode == "min" else Trial.objective_value.desc()
        return [value.nulls_last(), Trial.number]
    if order_by == "-number":
        return [Trial.number.desc()]
    return [Trial.number]


def _trial_or_404(session: Session, trial_id: int) -> Trial:
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} not found")
    return trial
