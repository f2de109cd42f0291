"""Runs one claimed trial on the Ray cluster (docs/workers.md; docs/spec.md, "Resources").

One process (`resources.workers == 1`): a plain Ray task, which starts in milliseconds on a warm
worker process. Several processes: Ray Train's `TorchTrainer` (DDP; gloo on CPU, NCCL on GPU),
whose `fit()` blocks, so it runs on a driver thread. Either way the Ray process only supervises:
the trial's code (its command, or the workload's trainer through `hpo.worker.trial_main`) runs in a
process started for this attempt alone and killed with all its descendants when the attempt ends
(worker/confine.py), so no trial's code ever runs in a process that Ray reuses or that holds a
connection to the cluster. Both end in an `Outcome` that the driver turns
into `complete` or `fail`. Ray never retries (`max_retries=0`, `FailureConfig(max_failures=0)`):
retries are the server's business, with their attempt accounting.

The driver talks to a running trial through a `TrialBoard` actor: it posts stop requests there
(heartbeat said `should_stop`, lease lost, worker shutting down), rank 0's reporter polls it without
blocking, and the trainer broadcasts the stop to every rank. DDP runs leave their outcome there too,
since `fit()` returns no value from the training function."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray

from hpo.collector_spec import CollectorSpec
from hpo.command_template import expand
from hpo.lifetime import become_subreaper, make_undumpable

from .client import ServerClient
from .collectors import CollectorUnavailable
from .collectors import require as require_collector
from .command import (
    CONFIG_FILE,
    DEFAULT_SILENCE_TIMEOUT_SECONDS,
    DEFAULT_STOP_GRACE_SECONDS,
    METRICS_FILE,
    CommandRun,
    CommandSettings,
    is_command,
    spec_environment,
    worker_dir,
)
from .confine import ConfinementError, Identity, RunAs
from .containment import Limits
from .reporter import FLUSH_POINTS, FLUSH_SECONDS, HttpReporter, Undelivered
from .trial_tree import remove_tree

_log = logging.getLogger("hpo.worker.runner")

# Statuses an Outcome may carry: the trainer's RunResult statuses plus `config` (ConfigError).
# `returned`: the worker could not run the attempt (its own disk); the server undoes the claim.
OUTCOME_STATUSES = ("completed", "infeasible", "error", "stopped", "config", "returned")


@dataclass(frozen=True)
class TrialJob:
    """Everything a trial process needs, built by the driver from a claim; picklable."""

    trial_id: int
    lease_id: str
    attempt: int
    config: dict[str, Any]
    out_dir: str
    artifact_root: str
    client: ServerClient
    board: Any
    processes: int = 1
    cpus_per_process: float = 1.0
    gpus_per_process: float = 0.0
    flush_points: int = FLUSH_POINTS
    flush_seconds: float = FLUSH_SECONDS
    collective_timeout_s: int = 600
    trainer: str = "hpo.trainer:train"
    # `trainer.command` trials (worker/command.py): the resolved working directory, and how long a
    # stopped command may take to checkpoint and exit before its process group is killed.
    command_cwd: str = ""
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    # Confinement (worker/confine.py): the user trial processes run as, and the worker environment
    # variables (globs) the operator passes to them beyond the fixed allow-list.
    run_as: RunAs | None = None
    pass_env: tuple[str, ...] = ()
    # What one process of the trial may hold (the operator's maximum, the study's own within it).
    limits: Limits = field(default_factory=Limits)

    @property
    def name(self) -> str:
        return f"hpo-trial-{self.trial_id}-attempt-{self.attempt}"


@dataclass
class Outcome:
    """How an attempt ended. `status` is one of OUTCOME_STATUSES; `started_at` and `first_step_at`
    are wall-clock times in the trial process (for the claim-to-first-step latency)."""

    status: str
    reason: str = ""
    step: int | None = None
    lease_lost: bool = False
    undelivered: Undelivered = field(default_factory=Undelivered)
    started_at: float | None = None
    first_step_at: float | None = None
    # Hyperparameters that never reached the script (worker/command.py unread_hyperparameters).
    unread_params: list[str] | None = None


class TrialBoard:
    """Ray actor (one per worker driver, `num_cpus=0`): stop requests out, DDP outcomes back,
    keyed by lease id, so a new attempt of the same trial never sees an old attempt's stop."""

    def __init__(self) -> None:
        self._stops: dict[str, str] = {}
        self._outcomes: dict[str, Outcome] = {}
        self._rendezvous: dict[str, dict[str, str]] = {}

    def request_stop(self, key: str, reason: str) -> None:
        self._stops.setdefault(key, reason)

    def stop_reason(self, key: str) -> str | None:
        return self._stops.get(key)

    def put_outcome(self, key: str, outcome: Outcome) -> None:
        self._outcomes[key] = outcome

    def put_rendezvous(self, key: str, env: dict[str, str]) -> None:
        self._rendezvous[key] = env

    def rendezvous(self, key: str) -> dict[str, str] | None:
        """`MASTER_ADDR` and `MASTER_PORT` that rank 0 of a DDP command trial chose."""
        return self._rendezvous.get(key)

    def take(self, key: str) -> Outcome | None:
        """Forgets the key; answers the outcome rank 0 left, if any."""
        self._stops.pop(key, None)
        self._rendezvous.pop(key, None)
        return self._outcomes.pop(key, None)


def create_board(timeout: float = 60.0) -> Any:
    """The board actor of this driver; it dies with the driver, as the trials it steers do.
    Answers once the actor is up, so a broken cluster shows at start-up and the first trial does
    not share the CPU with the start of the board's process."""
    board: Any = ray.remote(num_cpus=0, max_restarts=0)(TrialBoard).remote()
    ray.get(board.stop_reason.remote(""), timeout=timeout)
    return board


class BoardPoller:
    """`stop_requested` for the reporter: asks the board at most every `interval` seconds and never
    blocks a training step on the answer."""

    def __init__(self, board: Any, key: str, interval: float = 0.5) -> None:
        self._board, self._key, self._interval = board, key, interval
        self._pending: Any = None
        self._next = 0.0
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is not None:
            return True
        # Called at every training step: touch Ray (even a zero-timeout `ray.wait` costs about as
        # much as a small model's step) only once per interval.
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._interval
        if self._pending is None:
            self._pending = self._board.stop_reason.remote(self._key)
        elif ray.wait([self._pending], timeout=0)[0]:
            self.reason = ray.get(self._pending)
            self._pending = None
        return self.reason is not None


def run_rank(job: TrialJob, rank: int, launcher_env: dict[str, str] | None = None) -> Outcome | None:
    """Runs one process of the trial, in a process of its own (worker/confine.py): its command, or
    the workload's trainer through `hpo.worker.trial_main`. Rank 0 tails its files into an
    `HttpReporter` and answers the Outcome; another rank writes `attempt-<n>.rank-<r>` beside it (only
    rank 0's files count), answers None, and raises when its process failed, so that Ray Train
    ends the group instead of rank 0 waiting in a collective."""
    started = time.time()
    out_dir = rank_dir(Path(job.out_dir), rank)
    poller = BoardPoller(job.board, job.lease_id)
    try:
        with _identity(job) as identity:
            settings = _process_settings(job, rank, out_dir, launcher_env, identity)
            if rank != 0:
                result = CommandRun(settings, job.config, _BoardStop(poller), None).run()
                if result.status == "error":
                    raise RuntimeError(f"trial {job.trial_id} rank {rank}: {result.reason}")
                return None
            reporter = _rank0_reporter(job, out_dir, poller)
            try:
                result = CommandRun(settings, job.config, reporter, reporter).run()
                outcome = Outcome(result.status, result.reason, result.step, unread_params=result.unread_params)
            except OSError as exc:  # the program is missing or not executable on this node
                outcome = Outcome("error", f"could not start the command {settings.argv[0]!r}: {exc}")
            return _closed(outcome, reporter, started)
    except ConfinementError as exc:
        if rank != 0:
            raise
        return Outcome("error", f"could not confine the trial on this node: {exc}")
    except CollectorUnavailable as exc:  # trainer.metrics this worker cannot collect
        if rank != 0:
            raise
        return Outcome("config", str(exc))


def remove_attempt_files(out_dir: Path) -> None:
    """Deletes an attempt's folders (the trial's, the worker's, other ranks') on this node, best
    effort: an attempt returned unrun leaves nothing that fills the disk (worker/disk.py)."""
    for folder in [out_dir, *out_dir.parent.glob(f"{out_dir.name}.*")]:
        remove_tree(folder)


def rank_dir(out_dir: Path, rank: int) -> Path:
    """Rank 0 writes the attempt's folder; rank r a sibling `attempt-<n>.rank-<r>` (only rank 0's
    files count). Never inside rank 0's folder: each rank runs as a uid of its own, and a folder
    one trial user owns is no place for another rank's supervisor to make folders in."""
    return out_dir if rank == 0 else out_dir.with_name(f"{out_dir.name}.rank-{rank}")


@contextlib.contextmanager
def _identity(job: TrialJob) -> Iterator[Identity | None]:
    if job.run_as is None:
        yield None
    else:
        with job.run_as.take() as identity:
            yield identity


def trial_argv(job: TrialJob) -> tuple[str, ...]:
    """The trial's program: its `trainer.command`, or this Python running the workload's trainer."""
    command = (job.config.get("trainer") or {}).get("command")
    if command:
        return tuple(str(a) for a in command)
    return (sys.executable, "-m", "hpo.worker.trial_main", job.trainer)


def _process_settings(
    job: TrialJob, rank: int, out_dir: Path, launcher_env: dict[str, str] | None, identity: Identity | None
) -> CommandSettings:
    trainer = job.config.get("trainer") or {}
    collector = CollectorSpec.parse(trainer.get("metrics"))
    require_collector(collector)
    extra = spec_environment(trainer, launcher_env)
    if not is_command(job.config):
        # A workload imports from where this process imports (the worker's package, the operator's
        # modules): hpo sets the search path, never the spec (hpo.policy.PROTECTED_ENV).
        extra["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return CommandSettings(
        argv=tuple(expand(trial_argv(job), job.config.get("params") or {}, _builtins(job, out_dir))),
        cwd=Path(job.command_cwd) if is_command(job.config) and job.command_cwd else out_dir,
        out_dir=out_dir,
        rank=rank,
        extra_env=extra,
        identity=identity,
        pass_env=job.pass_env,
        collector=collector,
        log_dir=worker_dir(out_dir),
        limits=job.limits,
        stop_grace_seconds=job.stop_grace_seconds,
        silence_timeout_seconds=float(trainer.get("silence_timeout_seconds") or DEFAULT_SILENCE_TIMEOUT_SECONDS),
    )


def _builtins(job: TrialJob, out_dir: Path) -> dict[str, str]:
    """What `{seed}`, `{out_dir}`, `{resume_from}`, `{config}` and `{python}` stand for in a
    command (hpo.command_template)."""
    trainer = job.config.get("trainer") or {}
    return {
        "seed": str(job.config.get("seed", 0)),
        "out_dir": str(out_dir),
        "resume_from": str(trainer.get("resume_from") or ""),
        "config": str(worker_dir(out_dir) / CONFIG_FILE),
        "python": sys.executable,
    }


def _supervise_here() -> None:
    """Makes the Ray worker process that runs a trial its processes' reaper (a daemon that
    `setsid`s and double-forks is re-parented here and killed with the attempt), and keeps its
    memory and environment (the trial token, Ray's own variables) from other processes of its user."""
    become_subreaper()
    make_undumpable()


def _rank0_reporter(job: TrialJob, out_dir: Path, poller: BoardPoller) -> HttpReporter:
    """Rank 0's delivery of the points the supervisor accepted (`attempt-<n>.worker/metrics.jsonl`)
    and checkpoints to the server, started."""
    return HttpReporter(
        job.client,
        job.trial_id,
        job.lease_id,
        worker_dir(out_dir) / METRICS_FILE,
        Path(job.artifact_root),
        poller,
        flush_points=job.flush_points,
        flush_seconds=job.flush_seconds,
    ).start()


def _closed(outcome: Outcome, reporter: HttpReporter, started: float) -> Outcome:
    """The outcome with what its reporter knows once closed: undelivered points, a lost lease, timing."""
    outcome.undelivered = reporter.close()
    outcome.lease_lost = reporter.lease_lost
    outcome.started_at, outcome.first_step_at = started, reporter.first_step_at
    return outcome


class _BoardStop:
    def __init__(self, poller: BoardPoller) -> None:
        self.poller = poller

    def should_stop(self) -> bool:
        return self.poller()


@ray.remote(max_retries=0)
def _trial_process(job: TrialJob) -> Outcome | None:
    _supervise_here()
    return run_rank(job, 0)


def _ddp_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker function. Rank 0 leaves its outcome on the board; after an error it
    raises so Ray Train tears the group down instead of the other ranks waiting in a collective."""
    from ray import train as ray_train

    job: TrialJob = loop_config["job"]
    context = ray_train.get_context()
    rank = context.get_world_rank()
    _supervise_here()
    outcome = run_rank(job, rank, _torchrun_environment(job, context))
    if outcome is not None:
        ray.get(job.board.put_outcome.remote(job.lease_id, outcome))
        if outcome.status in ("error", "config"):
            raise RuntimeError(f"trial {job.trial_id} rank 0 ended with {outcome.status}")


def _torchrun_environment(job: TrialJob, context: Any, timeout: float = 120.0) -> dict[str, str]:
    """The variables `torchrun` sets, for the trial process's own `init_process_group`. Rank 0 picks a free
    port on its node (Ray Train's own process group holds the one in this process's MASTER_PORT)
    and leaves it on the board; the other ranks wait for it there."""
    rank = context.get_world_rank()
    if rank == 0:
        rendezvous = {"MASTER_ADDR": ray.util.get_node_ip_address(), "MASTER_PORT": str(_free_port())}
        ray.get(job.board.put_rendezvous.remote(job.lease_id, rendezvous))
    else:
        deadline = time.monotonic() + timeout
        while (rendezvous := ray.get(job.board.rendezvous.remote(job.lease_id))) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"trial {job.trial_id} rank {rank}: rank 0 chose no MASTER_PORT in {timeout:g} s")
            time.sleep(0.05)
    return {
        **rendezvous,
        "RANK": str(rank),
        "WORLD_SIZE": str(context.get_world_size()),
        "LOCAL_RANK": str(context.get_local_rank()),
        "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
        "GROUP_RANK": str(context.get_node_rank()),
        "NODE_RANK": str(context.get_node_rank()),
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class Execution(Protocol):
    """A started trial, as the driver sees it."""

    job: TrialJob

    def done(self) -> bool: ...

    def outcome(self) -> Outcome: ...


class TaskExecution:
    """A one-process trial running as a plain Ray task."""

    def __init__(self, job: TrialJob) -> None:
        self.job = job
        options = {"num_cpus": job.cpus_per_process, "num_gpus": job.gpus_per_process, "name": job.name}
        self.ref = _trial_process.options(**options).remote(job)

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])

    def outcome(self) -> Outcome:
        self.job.board.take.remote(self.job.lease_id)
        try:
            outcome = ray.get(self.ref)
        except Exception as exc:  # the process died or hpo.trainer failed to import
            return outcome_of_exception(exc)
        return outcome if outcome is not None else Outcome("error", "trial process answered nothing")


class TrainExecution:
    """A DDP trial: `TorchTrainer.fit()` on a driver thread."""

    def __init__(self, job: TrialJob, pool: concurrent.futures.Executor) -> None:
        self.job = job
        self.future = pool.submit(fit_ddp, job)

    def done(self) -> bool:
        return self.future.done()

    def outcome(self) -> Outcome:
        error = self.future.exception()
        outcome = ray.get(self.job.board.take.remote(self.job.lease_id))
        if outcome is not None:
            return outcome
        if error is None:
            return Outcome("error", "rank 0 left no outcome")
        return outcome_of_exception(error)


def fit_ddp(job: TrialJob) -> None:
    """Runs `job.processes` DDP processes with Ray Train; blocks until they end."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = job.gpus_per_process > 0
    resources = {"CPU": job.cpus_per_process, **({"GPU": job.gpus_per_process} if use_gpu else {})}
    trainer = TorchTrainer(
        _ddp_loop,
        train_loop_config={"job": job},
        scaling_config=ScalingConfig(num_workers=job.processes, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=job.name,
            # Ray Train's records are the worker's: beside the trial's folder, never in it.
            storage_path=str(worker_dir(Path(job.out_dir)) / "ray-train"),
            failure_config=FailureConfig(max_failures=0),
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=job.collective_timeout_s),
    )
    trainer.fit()


def outcome_of_exception(exc: BaseException) -> Outcome:
    """Ray's out-of-memory kill is a property of the point (`infeasible`: docs/worker-protocol.md,
    "5. End the attempt"); anything else that killed the process is an `error`, retried by the server."""
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return Outcome("infeasible", plain_reason(f"out of memory: {exc}")[-8000:])
    return Outcome("error", plain_reason(f"{type(exc).__name__}: {exc}")[-8000:])


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain_reason(text: str) -> str:
    """A failure reason as people read it: no terminal colour codes, and, for a traceback (Ray's
    include one), its last line, the exception itself, first."""
    text = _TERMINAL_CODES.sub("", text).strip()
    lines = text.splitlines()
    if len(lines) > 1 and any(line.startswith("Traceback") for line in lines):
        last = next((line.strip() for line in reversed(lines) if line.strip() and not line.startswith(" ")), "")
        if last and lines[0].strip() != last:
            return f"{last}\n\n{text}"
    return text


def launch(job: TrialJob, pool: concurrent.futures.Executor) -> Execution:
    """Starts the trial: a Ray task for one process, Ray Train for several."""
    if job.processes == 1:
        return TaskExecution(job)
    return TrainExecution(job, pool)
