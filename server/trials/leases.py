"""The worker protocol's state machine: claim with a fencing lease, heartbeat, complete, fail,
cancel, and the reaper that requeues trials whose lease expired.

Safe with several server processes: every transition is one conditional UPDATE judged by the
database (row locks on Postgres, one writer at a time on SQLite), never an in-process lock, and
lease times come from the database clock."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    Connection,
    Double,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from hpo.server.db import Database
from hpo.server.errors import Conflict, LeaseLost, NotFound
from hpo.server.metrics import objective
from hpo.server.models import (
    FINISHED_STATUSES,
    Checkpoint,
    MetricPoint,
    Study,
    StudyStatus,
    Trial,
    TrialAttempt,
    TrialStatus,
)
from hpo.server.schemas import Claim, HeartbeatAnswer

_log = logging.getLogger("hpo.server")
# A worker that may run none of the first few studies in line gets 204 rather than a long search.
MAX_REFUSED_STUDIES = 20


def claim_runnable(
    db: Database,
    worker_id: str,
    cpus: float,
    gpus: float,
    lease_seconds: float,
    runs: Callable[[int, dict[str, Any]], bool],
) -> Claim | None:
    """`claim`, but never a trial the worker would refuse: `runs(study_id, trainer)` says whether it
    may run a study's trainer settings (its operator's allow-list). A refused trial is handed back
    at once, as it was (no attempt used), and its study skipped for the rest of this claim."""
    refused: list[int] = []
    while len(refused) <= MAX_REFUSED_STUDIES:
        answer = claim(db, worker_id, cpus, gpus, lease_seconds, skip_studies=refused)
        if answer is None or runs(answer.study_id, dict(answer.config.get("trainer") or {})):
            return answer
        hand_back(db, answer.trial_id, answer.lease_id)
        refused.append(answer.study_id)
    return None


def hand_back(db: Database, trial_id: int, lease_id: str) -> None:
    """Undoes a claim that was never handed out: pending again, the attempt not counted (its
    trial_attempts row deleted)."""
    with db.transaction() as session:
        leased = select(Trial.attempt).where(Trial.id == trial_id, Trial.lease_id == lease_id).scalar_subquery()
        session.execute(delete(TrialAttempt).where(TrialAttempt.trial_id == trial_id, TrialAttempt.attempt == leased))
        session.execute(
            update(Trial)
            .where(Trial.id == trial_id, Trial.lease_id == lease_id)
            .values(
                status=TrialStatus.pending,
                lease_id=None,
                lease_expires_at=None,
                attempt=Trial.attempt - 1,
                worker_id=None,
                started_at=case((Trial.attempt == 1, None), else_=Trial.started_at),  # never ran
            )
            .execution_options(synchronize_session=False)
        )


def claim(
    db: Database,
    worker_id: str,
    cpus: float,
    gpus: float,
    lease_seconds: float,
    skip_studies: Sequence[int] = (),
) -> Claim | None:
    """Leases the oldest pending trial of an active study whose footprint fits the offered
    resources, with a new fencing `lease_id`; None when there is none. Two calls never get the
    same trial. Points above the resume step are deleted, so the resumed history has no gap and
    no duplicate.

    The hot path is one statement (pick, lease and read the study, with `FOR UPDATE SKIP LOCKED`
    on Postgres), built once per dialect; expired leases are reaped here at most once a second per
    process (and by the background reaper), not at every claim."""
    db.lease_seconds = lease_seconds
    params = {
        "lease_id": str(uuid.uuid4()),
        "worker_id": worker_id,
        "cpus": cpus,
        "gpus": gpus,
        "lease_seconds": lease_seconds,
    }
    if skip_studies:
        params["skipped"] = list(skip_studies)
    if not db.is_sqlite:
        return _claim_postgres(db, params, lease_seconds)
    statement = claim_statement(True, bool(skip_studies))
    with db.transaction() as session:
        reaped_first = db.reap_due()
        if reaped_first:
            _reap(session, db)
        row: Any = session.connection().execute(statement, params).first()
        if row is None and not reaped_first and _reap(session, db):
            # Nothing pending, but some leases had lapsed: those trials are claimable now.
            row = session.connection().execute(statement, params).first()
        if row is None:
            return None
        session.connection().execute(_open_attempt(), {"id": row.id, "attempt": row.attempt, "worker_id": worker_id})
        # SQLite's RETURNING sees only the updated table: the study is read separately.
        study = session.execute(
            select(Study.spec, Study.objective_metric, Study.objective_mode).where(Study.id == row.study_id)
        ).one()
        row = SimpleNamespace(**row._mapping, **study._mapping)
        resume = None
        if row.attempt > 1:  # a first attempt has no checkpoint to resume and no history to cut
            resume = resume_point(session, row.id, row.restart_after_attempt, row.attempt)
            truncate_history(session, row.id, row.objective_metric, row.objective_mode, resume)
        return claim_answer(row, lease_seconds, resume)


def _claim_postgres(db: Database, params: dict[str, Any], lease_seconds: float) -> Claim | None:
    """The claim in autocommit: the statement is its own transaction (one round trip where a
    transaction took four). A later attempt then cuts the trial's history in a transaction of its
    own, under the new lease: no one else writes to the trial meanwhile (its old lease is gone, the
    new worker has no answer yet), and a server that dies between the two leaves a leased trial
    whose lease expires, as one that dies before sending the answer always did."""
    statement = claim_statement(False, "skipped" in params)
    with db.statement() as connection:
        reaped_first = db.reap_due()
        if reaped_first:
            _reap(connection, db)
        row: Any = connection.execute(statement, params).first()
        if row is None and not reaped_first and _reap(connection, db):
            row = connection.execute(statement, params).first()
    if row is None:
        return None
    resume = None
    if row.attempt > 1:
        with db.transaction() as session:
            current = session.scalar(select(Trial.lease_id).where(Trial.id == row.id).with_for_update())
            if current != params["lease_id"]:  # expired already (a lease of a second or so)
                return None
            resume = resume_point(session, row.id, row.restart_after_attempt, row.attempt)
            truncate_history(session, row.id, row.objective_metric, row.objective_mode, resume)
    return claim_answer(row, lease_seconds, resume)


@functools.cache
def claim_statement(sqlite: bool, skipping: bool = False) -> Any:
    now = Database.clock(sqlite)
    # The statuses and the limit are written into the SQL, not bound: with them as parameters a
    # prepared claim's generic plan could not use the partial index of pending trials, so Postgres
    # planned every claim afresh (0.25 of its 0.5 ms); with them inline it keeps one plan.
    candidate = (
        select(Trial.id)
        .join(Study, Study.id == Trial.study_id)
        .where(Trial.status == _inline(TrialStatus.pending), Study.status == _inline(StudyStatus.active))
        .where(Study.cpus_needed <= bindparam("cpus"), Study.gpus_needed <= bindparam("gpus"))
        .order_by(Trial.id)
        .limit(literal_column("1"))
    )
    if skipping:
        candidate = candidate.where(Trial.study_id.not_in(bindparam("skipped", expanding=True)))
    if not sqlite:
        candidate = candidate.with_for_update(of=Trial, skip_locked=True)
    trial_columns = (
        Trial.id,
        Trial.study_id,
        Trial.number,
        Trial.arm,
        Trial.params,
        Trial.seed,
        Trial.attempt,
        Trial.restart_after_attempt,
        Trial.lease_id,
        Trial.lease_expires_at,
    )
    # SQLite's RETURNING sees only the updated table; there the study is read separately.
    study_columns = () if sqlite else (Study.spec, Study.objective_metric, Study.objective_mode)
    joined = () if sqlite else (Study.id == Trial.study_id,)
    lease = (
        update(Trial)
        .where(Trial.id == candidate.scalar_subquery(), *joined)
        .values(
            status=TrialStatus.running,
            lease_id=bindparam("lease_id"),
            lease_expires_at=now + bindparam("lease_seconds", type_=Double),
            attempt=Trial.attempt + 1,
            worker_id=bindparam("worker_id"),
            started_at=func.coalesce(Trial.started_at, func.now()),
        )
        .returning(*trial_columns, *study_columns)
        .execution_options(synchronize_session=False)
    )
    # The attempt's trial_attempts row: on Postgres in this statement, so every caller of it writes
    # the history with the lease; SQLite cannot nest an INSERT in a WITH (claim() adds it there).
    return lease if sqlite else _opening_attempt(lease)


def _inline(status: TrialStatus | StudyStatus) -> Any:
    """A status as a SQL literal (a stored status is its lower-case name, never quoted)."""
    return literal_column(f"'{status.value}'")


@functools.cache
def _open_attempt() -> Any:
    """SQLite: the claimed attempt's trial_attempts row, inserted in the claim's transaction."""
    return insert(TrialAttempt).values(
        trial_id=bindparam("id"), attempt=bindparam("attempt"), worker_id=bindparam("worker_id"), started_at=func.now()
    )


def _opening_attempt(lease: Any) -> Any:
    """Postgres: the `lease` UPDATE with its attempt's trial_attempts row inserted by the same
    statement (a data-modifying CTE): one round trip, the lease's own transaction; it answers the
    lease's RETURNING row as it is."""
    claimed = lease.cte("claimed")
    opened = insert(TrialAttempt).from_select(
        ["trial_id", "attempt", "worker_id", "started_at"],
        select(claimed.c.id, claimed.c.attempt, bindparam("worker_id", type_=String), func.now()),
    )
    return select(claimed).add_cte(opened.cte("opened"))


def heartbeat(db: Database, trial_id: int, lease_id: str, lease_seconds: float) -> HeartbeatAnswer:
    """Extends the lease; `should_stop` when the study is no longer active or the trial was
    cancelled. `LeaseLost` when the lease is not this worker's any more.

    On Postgres the renewal is one statement in autocommit; when it finds no row, the
    transaction below says why (404 or 409)."""
    db.lease_seconds = lease_seconds
    if not db.is_sqlite:
        with db.statement() as connection:
            row = connection.execute(heartbeat_statement(), {"id": trial_id, "lease_id": lease_id, "s": lease_seconds})
            renewed = row.first()
        if renewed is not None:
            stop = renewed.status != TrialStatus.running.value or renewed.study_status != StudyStatus.active.value
            return HeartbeatAnswer(lease_expires_at=float(renewed.lease_expires_at), should_stop=stop)
    with db.transaction() as session:
        trial = _leased(session, trial_id, lease_id, allow=(TrialStatus.running, TrialStatus.cancelled))
        study = session.get_one(Study, trial.study_id)
        expires = session.scalar(
            update(Trial)
            .where(Trial.id == trial_id)
            .values(lease_expires_at=db.now_seconds() + lease_seconds)
            .returning(Trial.lease_expires_at)
            .execution_options(synchronize_session=False)
        )
        stop = trial.status is TrialStatus.cancelled or study.status is not StudyStatus.active
        return HeartbeatAnswer(lease_expires_at=float(expires or 0.0), should_stop=stop)


@functools.cache
def heartbeat_statement() -> Any:
    statuses = (TrialStatus.running.value, TrialStatus.cancelled.value)
    return text(
        f"""UPDATE trials SET lease_expires_at = {Database.clock(False)} + CAST(:s AS double precision)
        FROM studies
        WHERE trials.id = :id AND trials.lease_id = :lease_id AND trials.status IN {statuses!r}
          AND studies.id = trials.study_id
        RETURNING trials.lease_expires_at, trials.status, studies.status AS study_status"""
    )


def complete(db: Database, trial_id: int, lease_id: str, unread_params: list[str] | None = None) -> None:
    with db.transaction() as session:
        trial = _leased(session, trial_id, lease_id)
        _finish(trial, TrialStatus.completed)
        _end_attempt(session, trial, "completed")
        _note_unread(trial, unread_params)
        session.get_one(Study, trial.study_id).consecutive_errors = 0


def fail(
    db: Database,
    trial_id: int,
    lease_id: str,
    kind: str,
    reason: str,
    step: int | None,
    unread_params: list[str] | None = None,
) -> str:
    """Ends the attempt. `infeasible` and `config` are final; `error` is retried from scratch
    until the study's `max_attempts`, then `failed`; `preempted` is requeued, resumable, and uses
    no attempt. Answers the trial's new status."""
    with db.transaction() as session:
        trial = _leased(session, trial_id, lease_id)
        study = session.get_one(Study, trial.study_id)
        if kind == "returned":
            _return_unrun(session, trial, study)
            return trial.status.value
        _end_attempt(session, trial, kind)
        if kind == "preempted":  # a give-back, not a failure: nothing is recorded against the trial
            _requeue(trial)
            return trial.status.value
        _note_unread(trial, unread_params)
        trial.fail_kind, trial.error, trial.error_step = kind, reason or None, step
        if kind == "infeasible":
            _finish(trial, TrialStatus.infeasible)
            study.consecutive_errors = 0
        else:
            trial.failures += 1
            if kind == "error" and trial.failures < study.max_attempts:
                _requeue(trial)
                trial.restart_after_attempt = trial.attempt
            else:
                _finish(trial, TrialStatus.failed)
            _count_error(study)
        return trial.status.value


def _return_unrun(session: Session, trial: Trial, study: Study) -> None:
    """The worker could not run the attempt through no fault of the trial (its artifact root is
    full or read-only: docs/workers.md, "Worker health"): the trial is as it was before the claim.
    Pending, the attempt not counted (its trial_attempts row and checkpoint records gone), no
    failure recorded, and its history cut back to what the claim left."""
    attempt = trial.attempt
    resume = resume_point(session, trial.id, trial.restart_after_attempt, attempt) if attempt > 1 else None
    session.execute(delete(Checkpoint).where(Checkpoint.trial_id == trial.id, Checkpoint.attempt == attempt))
    session.execute(delete(TrialAttempt).where(TrialAttempt.trial_id == trial.id, TrialAttempt.attempt == attempt))
    session.flush()
    truncate_history(session, trial.id, study.objective_metric, study.objective_mode, resume)
    session.refresh(trial)
    _requeue(trial)
    trial.attempt = attempt - 1
    trial.worker_id = None
    if attempt == 1:
        trial.started_at = None  # never ran


def _note_unread(trial: Trial, unread_params: list[str] | None) -> None:
    """Keeps the worker's account of the hyperparameters the script never read, limited to names
    the trial has (the account comes from the trial's own files). A preempted attempt's account is
    not kept: the script may read a name later in the run."""
    if unread_params is not None:
        names = set(trial.params or {})
        trial.unread_params = sorted({name for name in unread_params if name in names})


def cancel(db: Database, trial_id: int) -> None:
    """A person stops a trial that has not finished; its lease stays so the worker's next
    heartbeat answers `should_stop` instead of 409."""
    with db.transaction() as session:
        trial = session.get(Trial, trial_id, with_for_update=True)
        if trial is None:
            raise NotFound(f"trial {trial_id} not found")
        if trial.status in FINISHED_STATUSES:
            raise Conflict(f"trial {trial_id} is already {trial.status.value}")
        trial.status = TrialStatus.cancelled
        trial.finished_at = func.now()  # type: ignore[assignment]
        _end_attempt(session, trial, "cancelled")


def reap_expired(db: Database) -> int:
    """Requeues running trials whose lease expired (failing those past max_attempts); answers how
    many. Safe to run from every server process at once. On Postgres in autocommit, as from a
    claim: a lease extension after an outage (`_reap`) is committed before anything is reaped."""
    if not db.is_sqlite:
        with db.statement() as connection:
            return _reap(connection, db)
    with db.transaction() as session:
        return _reap(session, db)


def _reap(session: Session | Connection, db: Database) -> int:
    # The background reaper passes every quarter lease (app._reap_forever) and claims reap too:
    # a longer silence means this process could not reach the database (or did not run), and the
    # workers' heartbeats failed as well. Every running lease first gets a lease period from now,
    # the time a worker needs for its retried heartbeat to land: one idempotent UPDATE, so each
    # server process that saw the outage may do it, and none reaps a live worker's trial first.
    # The margin over a tick (a second at least, five at most) keeps a pass that a busy process
    # ran late from reading as an outage; a live worker's lease cannot lapse before two thirds of
    # a lease without a heartbeat (workers renew every third), and this is less.
    silent = db.unreached_for()
    if silent > db.lease_seconds / 4 + max(1.0, min(db.lease_seconds / 4, 5.0)):
        extended = _extend_leases(session, db)
        if extended:
            _log.warning(
                "lease reaper: the database was out of reach for %.0f s; %d running leases get %.0f s to heartbeat",
                silent,
                extended,
                db.lease_seconds,
            )
    reaped = _reap_now(session, db)
    db.reached()
    return reaped


def _extend_leases(session: Session | Connection, db: Database) -> int:
    renewed = db.now_seconds() + bindparam("grace", db.lease_seconds, type_=Double())
    short = select(Trial.id).where(Trial.status == TrialStatus.running, Trial.lease_expires_at < renewed)
    if not db.is_sqlite:  # as in the reap: a row someone holds (a heartbeat renewing it) is skipped
        short = short.with_for_update(skip_locked=True)
    extend = (
        update(Trial)
        .where(Trial.id.in_(short.scalar_subquery()))
        .values(lease_expires_at=renewed)
        .execution_options(synchronize_session=False)
    )
    return int(session.execute(extend).rowcount or 0)  # type: ignore[attr-defined]


def _reap_now(session: Session | Connection, db: Database) -> int:
    max_attempts = select(Study.max_attempts).where(Study.id == Trial.study_id).scalar_subquery()
    exhausted = Trial.failures + 1 >= max_attempts
    expired = select(Trial.id).where(Trial.status == TrialStatus.running, Trial.lease_expires_at < db.now_seconds())
    if not db.is_sqlite:
        # Rows another reaper (or a claim, a heartbeat) holds are skipped, not waited for: two
        # transactions locking the same expired rows in different orders would deadlock.
        expired = expired.with_for_update(skip_locked=True)
    reap = (
        update(Trial)
        .where(Trial.id.in_(expired.scalar_subquery()))
        .values(
            status=case((exhausted, TrialStatus.failed.value), else_=TrialStatus.pending.value),
            failures=Trial.failures + 1,
            lease_id=None,
            lease_expires_at=None,
            fail_kind=case((exhausted, "error"), else_=Trial.fail_kind),
            error=case((exhausted, "lease expired: the worker stopped heartbeating"), else_=Trial.error),
            finished_at=case((exhausted, func.now()), else_=None),
        )
        .returning(Trial.id, Trial.attempt)
        .execution_options(synchronize_session=False)
    )
    ended = update(TrialAttempt).values(ended_at=func.now(), outcome="expired")
    ended = ended.where(TrialAttempt.ended_at.is_(None)).execution_options(synchronize_session=False)
    if db.is_sqlite:  # in a transaction: the reaped attempts are closed by a second statement
        reaped = session.execute(reap).all()
        if reaped:
            session.execute(ended.where(TrialAttempt.trial_id.in_([r.id for r in reaped])))
        return len(reaped)
    # Postgres may run this in autocommit (a claim): one statement closes the attempts it reaps.
    requeued = reap.cte("reaped")
    closed = ended.where(TrialAttempt.trial_id == requeued.c.id, TrialAttempt.attempt == requeued.c.attempt)
    return int(session.execute(select(func.count()).select_from(requeued).add_cte(closed.cte("closed"))).scalar_one())


def _leased(
    session: Session, trial_id: int, lease_id: str, allow: tuple[TrialStatus, ...] = (TrialStatus.running,)
) -> Trial:
    """The trial, locked, if `lease_id` is its current lease and its status allows the write."""
    trial = session.get(Trial, trial_id, with_for_update=True)
    if trial is None:
        raise NotFound(f"trial {trial_id} not found")
    if trial.lease_id != lease_id:
        raise LeaseLost(f"lease {lease_id} is not the current lease of trial {trial_id}; stop this run")
    if trial.status not in allow:
        raise LeaseLost(f"trial {trial_id} is {trial.status.value}; stop this run")
    return trial


def _end_attempt(session: Session, trial: Trial, outcome: str) -> None:
    """Closes the lease's attempt (its trial_attempts row) in the transition's own transaction:
    `outcome` says how it ended (`completed`, a fail kind, `cancelled`)."""
    session.execute(
        update(TrialAttempt)
        .where(TrialAttempt.trial_id == trial.id, TrialAttempt.attempt == trial.attempt)
        .where(TrialAttempt.ended_at.is_(None))
        .values(ended_at=func.now(), outcome=outcome)
        .execution_options(synchronize_session=False)
    )


def _finish(trial: Trial, status: TrialStatus) -> None:
    trial.status = status
    trial.finished_at = func.now()  # type: ignore[assignment]


def _requeue(trial: Trial) -> None:
    trial.status = TrialStatus.pending
    trial.lease_id = None
    trial.lease_expires_at = None


def _count_error(study: Study) -> None:
    """After `max_failed_trials` errors in a row a study pauses itself instead of burning its
    budget on a broken config."""
    study.consecutive_errors += 1
    if study.consecutive_errors >= study.max_failed_trials and study.status is StudyStatus.active:
        study.status = StudyStatus.paused


def resume_point(session: Session, trial_id: int, restart_after_attempt: int, attempt: int) -> Checkpoint | None:
    """The newest checkpoint of an earlier attempt that may be resumed (none after an `error`)."""
    return session.scalar(
        select(Checkpoint)
        .where(Checkpoint.trial_id == trial_id)
        .where(and_(Checkpoint.attempt > restart_after_attempt, Checkpoint.attempt < attempt))
        .order_by(Checkpoint.step.desc(), Checkpoint.attempt.desc())
        .limit(1)
    )


# Postgres keeps points in chunks (migration 0014): those wholly after the resume step go, and the
# one a resume step falls inside keeps its steps up to it (its steps are ascending).
_DROP_CHUNKS = text(
    "DELETE FROM metric_chunks WHERE trial_id = :trial_id AND first_step > :after RETURNING cardinality(steps)"
)
_TRIM_CHUNKS = text(
    """
    WITH cut AS (
        SELECT name, first_step, cardinality(steps) AS total,
               (SELECT CAST(count(*) AS integer) FROM unnest(steps) AS s WHERE s <= :after) AS kept
        FROM metric_chunks WHERE trial_id = :trial_id AND first_step <= :after AND last_step > :after
    )
    UPDATE metric_chunks c
    SET steps = c.steps[1:cut.kept], vals = c.vals[1:cut.kept], nonfinite = c.nonfinite[1:cut.kept],
        last_step = c.steps[cut.kept]
    FROM cut WHERE c.trial_id = :trial_id AND c.name = cut.name AND c.first_step = cut.first_step
    RETURNING cut.total - cut.kept
    """
)


def _delete_points(session: Session, trial_id: int, after: int | None) -> int:
    """Deletes the trial's points (those after step `after`, when given); answers how many."""
    if session.get_bind().dialect.name == "sqlite":
        points = delete(MetricPoint).where(MetricPoint.trial_id == trial_id)
        if after is not None:
            points = points.where(MetricPoint.step > after)
        return int(session.execute(points).rowcount or 0)  # type: ignore[attr-defined]
    bound = {"trial_id": trial_id, "after": -1 if after is None else after}  # steps are never negative
    deleted = sum(session.execute(_DROP_CHUNKS, bound).scalars())
    if after is not None:
        deleted += sum(session.execute(_TRIM_CHUNKS, bound).scalars())
    return int(deleted)


def truncate_history(session: Session, trial_id: int, metric: str, mode: str, resume: Checkpoint | None) -> None:
    deleted = _delete_points(session, trial_id, None if resume is None else resume.step)
    # The quota's count follows (a NULL count, of a trial from before counting, stays NULL).
    count = 0 if resume is None else Trial.point_count - deleted
    # A resume keeps the earliest resume point of the history (points up to it are older attempts');
    # a start from scratch has none (a best value past it came from a resumed attempt: docs/analysis.md,
    # "Values from resumed attempts").
    resumed_from: Any = (
        None
        if resume is None
        else case(
            (Trial.resumed_from_step.is_not(None) & (Trial.resumed_from_step < resume.step), Trial.resumed_from_step),
            else_=resume.step,
        )
    )
    session.execute(
        update(Trial)
        .where(Trial.id == trial_id)
        .values(point_count=count, resumed_from_step=resumed_from)
        .execution_options(synchronize_session=False)
    )
    objective.refresh(session, trial_id, metric, mode)


def claim_answer(row: Any, lease_seconds: float, resume: Checkpoint | None) -> Claim:
    spec: dict[str, Any] = row.spec
    config = {
        "params": row.params,
        "trainer": spec.get("trainer", {}),
        "seed": row.seed,
        "objective": spec.get("objective", {"metric": row.objective_metric, "mode": row.objective_mode}),
        "resources": spec.get("resources", {}),
    }
    return Claim(
        trial_id=row.id,
        study_id=row.study_id,
        number=row.number,
        lease_id=row.lease_id or "",
        lease_expires_at=float(row.lease_expires_at or 0.0),
        lease_seconds=lease_seconds,
        attempt=row.attempt,
        arm=row.arm,
        config=config,
        resume_from=None if resume is None else {"step": resume.step, "uri": resume.uri, "attempt": resume.attempt},
        artifact_path=f"trials/{row.id}/attempt-{row.attempt}",
    )
