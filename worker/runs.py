"""The driver's record of one claimed trial: from claim to job, and from outcome to the final
protocol call (docs/worker-protocol.md, "5. End the attempt": `complete`, or `fail` with a kind)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import ArtifactPathError, attempt_dir, fallback_checkpoint, relative_attempt_path, resolve_checkpoint
from .capacity import Footprint
from .client import Backoff, LeaseLost, ProtocolError, ServerClient, ServerUnavailable
from .command import DEFAULT_STOP_GRACE_SECONDS, is_command, resolve_workdir
from .confine import RunAs
from .containment import Limits
from .reporter import FLUSH_POINTS, FLUSH_SECONDS
from .runner import Execution, Outcome, TrialJob, plain_reason

_log = logging.getLogger("hpo.worker")

# Why the driver asked a run to stop; the first reason wins.
STOP_PREEMPTED = "preempted: the worker is shutting down"
STOP_REQUESTED = "stopped: the study was paused or the trial cancelled"
STOP_LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class JobSettings:
    """Worker-wide settings that go into every job."""

    artifact_root: Path
    client: ServerClient
    board: Any
    flush_points: int = FLUSH_POINTS
    flush_seconds: float = FLUSH_SECONDS
    trainer: str = "hpo.trainer:train"
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    run_as: RunAs | None = None
    pass_env: tuple[str, ...] = ()
    limits: Limits = Limits()


def build_job(claim: dict[str, Any], settings: JobSettings) -> TrialJob:
    """The job for a claim. The attempt folder is built from the ids, not taken from the claim's
    `artifact_path`; `resume_from` is checked to lie under this trial's folder, and when it does
    not exist here (no shared storage), the attempt starts from scratch, which is still correct:
    the server kept only points up to the resume step and the new run overwrites them."""
    trial_id, attempt = int(claim["trial_id"]), int(claim["attempt"])
    if claim.get("artifact_path") not in (None, relative_attempt_path(trial_id, attempt)):
        _log.warning(
            "trial %d: server named artifact path %r; using the one built from ids",
            trial_id,
            claim.get("artifact_path"),
        )
    config = dict(claim["config"])
    trainer = {k: v for k, v in dict(config.get("trainer") or {}).items() if k != "resume_from"}
    resume = _resume_path(claim, settings.artifact_root, trial_id)
    if resume is not None:
        trainer["resume_from"] = str(resume)
    config["trainer"] = trainer
    footprint = Footprint.of(config.get("resources") or {})
    return TrialJob(
        trial_id=trial_id,
        lease_id=str(claim["lease_id"]),
        attempt=attempt,
        config=config,
        out_dir=str(attempt_dir(settings.artifact_root, trial_id, attempt)),
        artifact_root=str(settings.artifact_root.absolute()),
        # Never the worker's own token: trial code runs in that process (docs/security.md).
        client=settings.client.for_trial(claim.get("trial_token")),
        board=settings.board,
        processes=footprint.processes,
        cpus_per_process=footprint.cpus,
        gpus_per_process=footprint.gpus,
        flush_points=settings.flush_points,
        flush_seconds=settings.flush_seconds,
        trainer=settings.trainer,
        stop_grace_seconds=settings.stop_grace_seconds,
        run_as=settings.run_as,
        pass_env=settings.pass_env,
        limits=trial_limits(settings.limits, config.get("resources") or {}),
    )


def trial_limits(maximum: Limits, resources: dict[str, Any]) -> Limits:
    """The study's `resources.max_processes` and `resources.memory_gb`, within the worker's maximum
    (values the server did not check count as not given)."""
    processes, memory = resources.get("max_processes"), resources.get("memory_gb")
    processes = processes if isinstance(processes, int) and processes > 0 else None
    memory_bytes = int(memory * 2**30) if isinstance(memory, (int, float)) and memory > 0 else None
    return maximum.within(processes, memory_bytes)


class CommandRefused(ValueError):
    """A `trainer.command` this worker will not run (its allow-list, its workdir root)."""


def prepare_command(job: TrialJob, workdir_root: Path) -> TrialJob:
    """For a command trial (already allowed by the operator's policy: `loop.execution_refusal`):
    resolves the working directory under `workdir_root`; raises `CommandRefused` with the reason
    (the trial then fails as `config`, never retried). Other trials pass unchanged."""
    if not is_command(job.config):
        return job
    trainer = job.config["trainer"]
    try:
        cwd = resolve_workdir(workdir_root, trainer.get("workdir"))
    except ValueError as exc:
        raise CommandRefused(str(exc)) from None
    return dataclasses.replace(job, command_cwd=str(cwd))


def _resume_path(claim: dict[str, Any], root: Path, trial_id: int) -> Path | None:
    resume = claim.get("resume_from")
    if not resume:
        return None
    try:
        path = resolve_checkpoint(root, trial_id, str(resume.get("uri", "")))
    except ArtifactPathError as exc:
        _log.warning("trial %d: not resuming: %s", trial_id, exc)
        return None
    if path.exists():
        return path
    fallback = fallback_checkpoint(path, int(resume.get("step", -1)))
    if fallback is None:
        _log.warning("trial %d: checkpoint %s is not on this node; starting from scratch", trial_id, path)
    else:
        _log.warning("trial %d: checkpoint %s is gone; resuming from the older %s", trial_id, path, fallback.name)
    return fallback


def verdict(outcome: Outcome, stop_reason: str | None) -> tuple[str, str, int | None] | None:
    """`(kind, reason, step)` for the final call, kind `complete` or a fail kind; None when the
    lease is lost and nothing may be written."""
    if outcome.lease_lost or stop_reason == STOP_LEASE_LOST:
        return None
    if outcome.status == "completed":
        return ("complete", "", outcome.step)
    if outcome.status in ("infeasible", "error", "config", "returned"):
        return (outcome.status, plain_reason(outcome.reason), outcome.step)
    # stopped: given back to be resumed from its checkpoint; a pause or cancel comes here too (the
    # server answers 409 for a cancelled trial, which is then simply done).
    return ("preempted", stop_reason or outcome.reason or "stopped", outcome.step)


@dataclass
class Run:
    """One claimed trial in this driver, from claim to the final call."""

    claim: dict[str, Any]
    job: TrialJob
    footprint: Footprint
    execution: Execution | None
    claimed_at: float = field(default_factory=time.time)
    next_heartbeat: float = 0.0
    stop_reason: str | None = None
    outcome: Outcome | None = None
    next_try: float = 0.0
    _delays: Any = None

    @property
    def trial_id(self) -> int:
        return self.job.trial_id

    @property
    def lease_id(self) -> str:
        return self.job.lease_id

    @property
    def heartbeat_period(self) -> float:
        return float(self.claim.get("lease_seconds", 60.0)) / 3

    def try_finish(self, client: ServerClient) -> bool:
        """One try at delivering what rank 0 left and making the final call; True when done (also
        when the server refused for good), False to be tried again after a backoff."""
        assert self.outcome is not None
        try:
            self._deliver_leftovers(client)
            self._final_call(client)
            return True
        except ServerUnavailable as exc:
            self._delays = self._delays or Backoff(initial=1.0, maximum=30.0).delays()
            delay = next(self._delays)
            self.next_try = time.monotonic() + delay
            _log.warning(
                "trial %d: cannot report the end of the run (%s); retrying in %.1f s", self.trial_id, exc, delay
            )
            return False
        except ProtocolError as exc:
            _log.warning("trial %d: final report refused: %s", self.trial_id, exc)
            return True

    def _deliver_leftovers(self, client: ServerClient) -> None:
        assert self.outcome is not None
        left = self.outcome.undelivered
        if self.outcome.lease_lost or self.stop_reason == STOP_LEASE_LOST:
            return
        while left.points:
            client.post_metrics(self.trial_id, self.lease_id, left.points[:5000])
            del left.points[:5000]
        while left.checkpoints:
            step, uri, objective = left.checkpoints[0]
            client.post_checkpoint(self.trial_id, self.lease_id, step, uri, objective, deleted=left.deleted)
            left.checkpoints.pop(0)
            left.deleted = []
        if left.deleted and left.carrier is not None:
            # Records of files the run deleted go before the trial ends (a resume must never be
            # offered a deleted checkpoint): re-sent on the newest surviving record.
            step, uri, objective = left.carrier
            client.post_checkpoint(self.trial_id, self.lease_id, step, uri, objective, deleted=left.deleted)
            left.deleted = []

    def _final_call(self, client: ServerClient) -> None:
        assert self.outcome is not None
        decided = verdict(self.outcome, self.stop_reason)
        if decided is None:
            _log.info("trial %d: lease lost; the run was dropped", self.trial_id)
            return
        kind, reason, step = decided
        try:
            unread = self.outcome.unread_params
            if kind == "complete":
                client.complete(self.trial_id, self.lease_id, unread_params=unread)
                status = "completed"
            else:
                status = client.fail(self.trial_id, self.lease_id, kind, reason, step, unread_params=unread)
        except LeaseLost as exc:
            _log.info("trial %d: %s (final %s not recorded)", self.trial_id, exc, kind)
            return
        _log.info("trial %d attempt %d: %s -> %s", self.trial_id, self.job.attempt, kind, status)
