"""Request and response shapes of the HTTP API, named by purpose (`StudyPublic`, `ClaimRequest`).
They are also the frozen value types the service functions return, separate from storage rows."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hpo.server.numbers import INTEGRAL, Integer, parse_number, to_json

TrialStatusName = Literal["pending", "running", "completed", "infeasible", "failed", "cancelled"]


class _Request(BaseModel):
    # strict: `true` is not a number and "7" is not an integer.
    model_config = ConfigDict(extra="forbid", strict=True)


class _Public(BaseModel):
    model_config = ConfigDict(frozen=True)


class Page(_Public):
    items: list[Any]
    total: int


class Warning(_Public):
    kind: str
    message: str
    param: str | None = None
    side: str | None = None
    trial_id: int | None = None


class TrialCounts(_Public):
    pending: int = 0
    running: int = 0
    completed: int = 0
    infeasible: int = 0
    failed: int = 0
    cancelled: int = 0


class _StudyView(_Public):
    id: int
    name: str
    description: str
    goal: str
    status: Literal["active", "paused", "archived", "completed"]
    algorithm: str
    seed: int
    num_trials: int
    objective: dict[str, str]
    trial_counts: TrialCounts
    best_trial_id: int | None
    best_value: float | None
    created_at: str
    # Why the study is paused (it paused itself after failures, naming the last one; or a person
    # paused it); None otherwise.
    status_reason: str | None = None


class StudyPublic(_StudyView):
    spec: dict[str, Any]


class StudyListItem(_StudyView):
    """A study in a list: its spec inline only up to `studies.LIST_SPEC_BYTES` of JSON, else null
    with `spec_truncated` (the whole spec is at GET /api/v1/studies/{id}; docs/api.md)."""

    spec: dict[str, Any] | None
    spec_bytes: int
    spec_truncated: bool = False


class StudyCreated(StudyPublic):
    warnings: list[Warning]


class StudyPatch(_Request):
    status: Literal["active", "paused", "archived"] | None = None
    num_trials: Annotated[int, Field(ge=1, le=100_000), INTEGRAL] | None = None


class ManualTrialIn(_Request):
    params: dict[str, Any] = Field(max_length=1000)

    @field_validator("params")
    @classmethod
    def _scalar_values(cls, params: dict[str, Any]) -> dict[str, Any]:
        # Hyperparameter values are scalars; nothing nested reaches the spec checks or the database.
        for name, value in params.items():
            too_long = len(name) > 200 or (isinstance(value, str) and len(value) > 10_000)
            if too_long or not isinstance(value, (str, int, float)):
                raise ValueError(f"{name[:200]!r} must be a string, a number or a boolean")
        return params

    seed: Annotated[int, Field(ge=0, lt=2**31), INTEGRAL] | None = None


class ManualTrialsIn(_Request):
    trials: list[ManualTrialIn] = Field(min_length=1, max_length=10_000)


class TrialPublic(_Public):
    id: int
    study_id: int
    number: int
    arm: dict[str, Any]
    status: TrialStatusName
    params: dict[str, Any]
    seed: int
    point_index: int | None
    replica_of: int | None
    # Set on the new run of a failed trial (POST /trials/{id}/retry): the trial it retries.
    retry_of: int | None = None
    attempt: int
    objective_value: float | None
    best_step: int | None
    # Its best value was reached in an attempt that resumed from a checkpoint (docs/analysis.md,
    # "Values from resumed attempts").
    resumed: bool = False
    fail_kind: str | None
    error: str | None
    error_step: int | None
    worker_id: str | None
    # Hyperparameters that never reached the script (worker/command.py); None when unknown.
    unread_params: list[str] | None = None
    # What the trial itself tells the researcher (`unread_hyperparameter`).
    warnings: list[dict[str, Any]] = Field(default_factory=list)


class ClaimResources(_Request):
    """What the worker can place for one trial now."""

    cpus: float = Field(default=1.0, ge=0, le=1_000_000)
    gpus: float = Field(default=0.0, ge=0, le=100_000)


class WorkerCapabilities(_Request):
    """What the worker's operator lets it run (hpo.policy.ExecutionPolicy): the server hands it no
    trial it would refuse, so a study it may not run waits for a worker that may."""

    workloads: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list, max_length=100)
    commands: list[Annotated[list[Annotated[str, Field(max_length=4096)]], Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=100
    )
    env: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list, max_length=100)


class ClaimRequest(_Request):
    worker_id: str = Field(min_length=1, max_length=200)
    resources: ClaimResources = Field(default_factory=ClaimResources)
    # Absent: the worker runs whatever the server hands it (and refuses what its policy does not allow).
    capabilities: WorkerCapabilities | None = None


class Claim(_Public):
    trial_id: int
    study_id: int
    number: int
    lease_id: str
    lease_expires_at: float
    lease_seconds: float
    attempt: int
    arm: dict[str, Any]
    config: dict[str, Any]
    resume_from: dict[str, Any] | None
    artifact_path: str
    # Set when the server needs tokens: lets the trial process post its own metrics and
    # checkpoints (and nothing else), so it never holds the worker's token.
    trial_token: str | None = None


class LeaseRequest(_Request):
    lease_id: str = Field(min_length=1, max_length=36)


class HeartbeatAnswer(_Public):
    lease_expires_at: float
    should_stop: bool


class MetricPointIn(_Request):
    step: Integer = Field(ge=0, lt=2**31)
    name: str = Field(min_length=1, max_length=200)
    value: float

    @field_validator("value", mode="before")
    @classmethod
    def _number_or_special(cls, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError('must be a number or one of "NaN", "Infinity", "-Infinity"')
        return parse_number(value)


class MetricsIn(LeaseRequest):
    points: list[MetricPointIn] = Field(max_length=100_000)


class MetricsAccepted(_Public):
    accepted: int
    objective_value: float | None
    best_step: int | None


class MetricPointPublic(_Public):
    step: int
    name: str
    value: float | str

    @classmethod
    def of(cls, step: int, name: str, value: float) -> MetricPointPublic:
        return cls(step=step, name=name, value=to_json(value))  # type: ignore[arg-type]


class CheckpointIn(LeaseRequest):
    step: Integer = Field(ge=0, lt=2**31)
    uri: str = Field(min_length=1, max_length=4000)
    objective: float | None = None
    # Steps of this attempt whose files retention deleted: their records are removed.
    deleted_steps: list[Annotated[int, Field(ge=0, lt=2**31)]] = Field(default_factory=list, max_length=100_000)

    @field_validator("objective", mode="before")
    @classmethod
    def _number_or_special(cls, value: Any) -> float | None:
        return None if value is None else parse_number(value)


class CheckpointPublic(_Public):
    id: int
    trial_id: int
    attempt: int
    step: int
    uri: str
    objective: float | str | None


# Hyperparameter names (at most a spec's 1,000, each at most 100 characters, server/spec/model.py).
UnreadParams = list[Annotated[str, Field(min_length=1, max_length=100)]] | None


class CompleteRequest(LeaseRequest):
    # The names that reached the script neither through a placeholder nor through hpo.session()
    # (worker/command.py); absent when the worker cannot know.
    unread_params: UnreadParams = Field(default=None, max_length=1000)


class WorkerHealthIn(_Request):
    """A worker's report of its own health (docs/workers.md, "Worker health")."""

    worker_id: str = Field(min_length=1, max_length=200)
    healthy: bool
    reason: str = Field(default="", max_length=2000)


class FailRequest(LeaseRequest):
    # `returned`: the worker could not run the trial (its own disk): undone as if never claimed.
    kind: Literal["infeasible", "error", "preempted", "config", "returned"]
    reason: str = Field(default="", max_length=20_000)
    step: Annotated[int, Field(ge=0, lt=2**31), INTEGRAL] | None = None
    unread_params: UnreadParams = Field(default=None, max_length=1000)


class StudyRetryRequest(_Request):
    """Which failed trials of a study to run again: every one, or those of one fail kind."""

    kind: Literal["config", "error"] | None = None


class ReplicasRequest(_Request):
    count: Integer = Field(ge=1, le=100)


class StudyReplicasRequest(_Request):
    """Replicas of the best `per_arm` original trials of every arm, `count` of each."""

    per_arm: Integer = Field(default=1, ge=1, le=10)
    count: Integer = Field(ge=1, le=100)
