"""Storage rows (SQLAlchemy 2 typed models). Alembic migrations in `migrations/` create them; a
test compares the two, so they never drift."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# A fixed naming convention so Alembic's batch mode on SQLite can find and alter constraints.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonDocument = JSON().with_variant(JSONB(), "postgresql")


class StudyStatus(str, enum.Enum):
    active = "active"
    paused = "paused"
    archived = "archived"


class TrialStatus(str, enum.Enum):
    pending = "pending"
    running = "running"
    completed = "completed"
    infeasible = "infeasible"
    failed = "failed"
    cancelled = "cancelled"


FINISHED_STATUSES = (TrialStatus.completed, TrialStatus.infeasible, TrialStatus.failed, TrialStatus.cancelled)


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(cls, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    goal: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[StudyStatus] = mapped_column(_enum(StudyStatus), default=StudyStatus.active)
    algorithm: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(BigInteger)
    num_trials: Mapped[int] = mapped_column(Integer)
    # The quasi-random designer's position: advanced in the transaction that inserts the trials.
    next_point_index: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    objective_metric: Mapped[str] = mapped_column(String(200))
    objective_mode: Mapped[str] = mapped_column(String(3))
    # One trial's whole footprint (workers x per-worker), compared with what a claim offers.
    cpus_needed: Mapped[float] = mapped_column(Double)
    gpus_needed: Mapped[float] = mapped_column(Double)
    max_attempts: Mapped[int] = mapped_column(Integer)
    max_failed_trials: Mapped[int] = mapped_column(Integer)
    consecutive_errors: Mapped[int] = mapped_column(Integer, default=0)
    # The round this study belongs to (docs/rounds.md); `round_role` is "baseline" for the study
    # that reruns the pipeline's baseline configuration beside a round's candidate, else NULL.
    # No foreign key: SQLite could add one only by copying the table, and nothing deletes rounds.
    round_id: Mapped[int | None] = mapped_column(Integer, index=True)
    round_role: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


_PENDING = text("status = 'pending'")
_RUNNING = text("status = 'running'")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        # Partial indexes keep the claim's "oldest pending" and the reaper's "expired running"
        # lookups O(1) however many trials a study has already run.
        Index("ix_trials_pending_id", "id", postgresql_where=_PENDING, sqlite_where=_PENDING),
        Index("ix_trials_running_lease", "lease_expires_at", postgresql_where=_RUNNING, sqlite_where=_RUNNING),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    arm: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    params: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    point_index: Mapped[int | None] = mapped_column(Integer)
    unit_point: Mapped[list[float] | None] = mapped_column(JsonDocument)
    seed: Mapped[int] = mapped_column(BigInteger)
    replica_of: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="SET NULL"))
    # A new run of a failed trial (POST /trials/{id}/retry) names it; no foreign key (migration 0008).
    retry_of: Mapped[int | None] = mapped_column(Integer)
    replica_index: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[TrialStatus] = mapped_column(_enum(TrialStatus), default=TrialStatus.pending)
    # attempt counts claims (it names the attempt's artifact folder); failures counts the attempts
    # used up by expiry or error, compared with the study's max_attempts. Preemption uses none.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    # Checkpoints of attempts up to this one are not resumed from: an `error` restarts from scratch.
    restart_after_attempt: Mapped[int] = mapped_column(Integer, default=0)
    # The earliest checkpoint step its history was resumed from since its last start from scratch
    # (leases.truncate_history; migration 0009): a best step beyond it came from a resumed attempt.
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)
    lease_id: Mapped[str | None] = mapped_column(String(36))
    # Seconds since the epoch on the database's clock (see db.now_seconds), so every server
    # process and worker agrees on expiry whatever their own clocks say.
    lease_expires_at: Mapped[float | None] = mapped_column(Double)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    objective_value: Mapped[float | None] = mapped_column(Double)
    best_step: Mapped[int | None] = mapped_column(Integer)
    fail_kind: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    error_step: Mapped[int | None] = mapped_column(Integer)
    # How many metric points the trial holds (the quota, results.record_metrics), kept as points
    # are added and cut; NULL on trials from before it was kept: counted at their next write.
    point_count: Mapped[int | None] = mapped_column(Integer, default=0)
    # Hyperparameter names the script never read (hpo.session) nor got through a placeholder, as
    # the worker saw them at the end of the last attempt; NULL when unknown (migration 0010).
    unread_params: Mapped[list[str] | None] = mapped_column(JsonDocument)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class MetricPoint(Base):
    __tablename__ = "metric_points"

    # No foreign key on purpose: its per-row check was half of the ingest cost (23 of 48 ms for a
    # 2,000-point batch on Postgres). Every write first locks the trial row under its lease
    # (results._fenced), and nothing deletes trials; whatever does must delete their points.
    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    # NULL when not finite; `nonfinite` then says which (NonFinite).
    value: Mapped[float | None] = mapped_column(Double)
    nonfinite: Mapped[int] = mapped_column(SmallInteger, default=0)


class CurveStat(Base):
    """One ended trial's aggregates of one metric's curve (`analysis.queries.curve_stats`), kept
    so a study's analysis (completed trials) and trial table (any ended one) do not read every
    point again: an ended trial's points no longer change. A row holds for the trial's `attempt`
    and the `cut`, `first_step` and `first_obj` it was computed with, and is recomputed when one
    differs. `n` 0: no such points. No foreign key, as for metric_points (nothing deletes trials)."""

    __tablename__ = "curve_stats"

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    cut: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(Integer)
    first_obj: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    v0: Mapped[float | None] = mapped_column(Double)
    vmin: Mapped[float | None] = mapped_column(Double)
    vmax: Mapped[float | None] = mapped_column(Double)
    late_n: Mapped[int | None] = mapped_column(Integer)
    late_min: Mapped[float | None] = mapped_column(Double)
    late_max: Mapped[float | None] = mapped_column(Double)
    sx: Mapped[float | None] = mapped_column(Double)
    sy: Mapped[float | None] = mapped_column(Double)
    sxx: Mapped[float | None] = mapped_column(Double)
    sxy: Mapped[float | None] = mapped_column(Double)
    syy: Mapped[float | None] = mapped_column(Double)
    s1: Mapped[int | None] = mapped_column(Integer)


class CurveSketch(Base):
    """One completed trial's curve of one metric as the study page's curves chart draws it: one
    point per `width` steps, the bucket's first step and mean value (`analysis.sketches`), kept so
    the chart reads a row per trial instead of every point of its best trials. It holds for the
    trial's `attempt` and that `width`; anything else is aggregated from the points. `steps` and
    `means` are little-endian int64 and float64 arrays, a mean NaN where a bucket held only
    non-finite values. No foreign key, as for metric_points (nothing deletes trials)."""

    __tablename__ = "curve_sketches"

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    width: Mapped[int] = mapped_column(Integer)
    steps: Mapped[bytes] = mapped_column(LargeBinary)
    means: Mapped[bytes] = mapped_column(LargeBinary)


class KeptChart(Base):
    """One study's first-screen chart (`kept_charts.FIRST_SCREEN`) as the chart endpoint answered
    it, or its analysis' checklist (kind `analysis`), kept for the study version
    (`analysis.memo.version`) it was computed at, by the code that computed it (`code`: a digest of
    the server's sources), so a fresh server's first visit reads it instead of judging every trial
    again (`kept_charts`). Written only while no trial of the
    study runs; any other version or code is recomputed. No foreign key, as for metric_points."""

    __tablename__ = "kept_charts"

    study_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(40), primary_key=True)
    version: Mapped[str] = mapped_column(Text)
    code: Mapped[str] = mapped_column(String(64))
    body: Mapped[bytes] = mapped_column(LargeBinary)


class TrialAttempt(Base):
    """One attempt of a trial: a claim opens it (in the claim's statement), and whatever ends the
    lease closes it in the same transaction (hpo.server.trials.leases): `outcome` is `completed`, a fail
    kind (`error`, `infeasible`, `config`, `preempted`), `expired` (the reaper) or `cancelled`;
    NULL, with no `ended_at`, while it runs. A claim handed back unrun deletes its row. The
    dashboard's timeline draws one bar per row. Trials from before migration 0011 have none.
    No foreign key, as for metric_points: its check would cost every claim, and nothing deletes
    trials."""

    __tablename__ = "trial_attempts"

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(String(16))


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("trial_id", "attempt", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    objective: Mapped[float | None] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ApiToken(Base):
    """An API token (hpo.server.auth.tokens): only its SHA-256 is stored; the token is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DashboardSession(Base):
    """A dashboard session (hpo.server.auth.tokens): the cookie holds a random id, only its SHA-256 is
    stored, so neither a copy of this table nor of the signing key lets anyone take a session over.
    Sign-out deletes the row; every server process sees that at once."""

    __tablename__ = "dashboard_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)
    # Seconds since the epoch.
    expires_at: Mapped[float] = mapped_column(Double)


class Note(Base):
    """A person's note in the dashboard, on a study (`trial_id` 0) or on one of its trials."""

    __tablename__ = "notes"

    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True)
    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Who saved it last: the API token's name (a dashboard session's: the token it signed in with);
    # NULL when the server needs no token, or for notes from before 0011 (hpo.server.studies.notes).
    author: Mapped[str | None] = mapped_column(String(200))


class BayesianState(Base):
    """A bayesian study's proposal queue (hpo.server.bayesian.queue): the lease that lets one
    server process at a time fit its model, the proposal counter (seeds the designer) and the
    latest model's view for the analysis."""

    __tablename__ = "bayesian_state"

    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    # Seconds since the epoch on the database clock, like trial leases.
    lease_until: Mapped[float | None] = mapped_column(Double)
    next_proposal: Mapped[int] = mapped_column(Integer, default=0)
    initial_trials: Mapped[int] = mapped_column(Integer)
    # Warm-start observations: {"arm key": [[unit point], value or null], ...} from earlier studies.
    warm: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    model_view: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)


class BayesianProposal(Base):
    """What a proposed trial was made from: the finished trials observed, the trials pending or
    running at the time, the seed and the model used."""

    __tablename__ = "bayesian_proposals"

    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    proposal_index: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    model: Mapped[str] = mapped_column(String(32))
    observed_trial_ids: Mapped[list[int]] = mapped_column(JsonDocument)
    pending_trial_ids: Mapped[list[int]] = mapped_column(JsonDocument)
    warm_observations: Mapped[int] = mapped_column(Integer)
    fit_seconds: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Pipeline(Base):
    """The training pipeline being improved round after round (docs/rounds.md): its objective,
    trainer settings and baseline configuration. The baseline changes only by a launch."""

    __tablename__ = "pipelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    objective_metric: Mapped[str] = mapped_column(String(200))
    objective_mode: Mapped[str] = mapped_column(String(3))
    trainer: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    baseline_params: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    # Which trial and round set the baseline (NULL for the one the pipeline was created with), and
    # its measured objective `{value, mean, std, n, values, diverged}` (NULL until measured).
    baseline_trial_id: Mapped[int | None] = mapped_column(Integer)
    baseline_round_id: Mapped[int | None] = mapped_column(Integer)
    baseline_objective: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Round(Base):
    """One round of incremental tuning: a goal, its studies (studies.round_id) and a decision."""

    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("pipeline_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    goal: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    # `{adopt, note, override, verdict, trial_id, decided_at}` once decided, else NULL.
    decision: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Launch(Base):
    """An adoption of a round's candidate as the pipeline's baseline, in order of `id`."""

    __tablename__ = "launches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("pipelines.id", ondelete="CASCADE"), index=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="SET NULL"))
    params_before: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    params_after: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    objective_before: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    objective_after: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RoundRecipe(Base):
    """A recipe run on a round (docs/rounds.md, "Recipes"): the study it created, the options it
    was made with, and its readout once that study finished."""

    __tablename__ = "round_recipes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    options: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    readout: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class WorkerHealth(Base):
    """What each worker last said of its own health (docs/workers.md, "Worker health"): a worker
    that cannot write its artifact root stops claiming and reports why; `/metrics` and the
    dashboard show the recent reports. One row per worker id, overwritten."""

    __tablename__ = "worker_health"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    healthy: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(String(2000))
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


def resumed(best_step: int | None, resumed_from_step: int | None) -> bool:
    """Whether a trial's best value was reached in an attempt that started from a checkpoint: its
    best step lies beyond the earliest step its history was resumed from (`Trial.resumed_from_step`;
    points up to that step come from the uninterrupted attempt before it)."""
    return best_step is not None and resumed_from_step is not None and best_step > resumed_from_step
