"""The worker: a Ray driver that keeps a cluster busy with trials from the server.

One thread does everything that talks to the server for the driver (claims, heartbeats, final
calls), each with a single try and its own backoff, so a server outage never blocks a tick for more
than one request timeout and never crashes the worker; the trials keep training meanwhile, and
rank 0's reporter buffers their points on disk. Each tick:

1. collects trials whose process ended and makes their final call (`complete` / `fail`);
2. heartbeats every lease a third of the way through it (docs/worker-protocol.md, "2. Heartbeat");
   `should_stop` or a 409 posts a stop on the `TrialBoard`, which rank 0 polls;
3. claims more trials while the cluster has free resources (`Capacity`), several at once.

SIGTERM (or SIGINT) drains: no more claims, every run is asked to stop, the trainer checkpoints,
each trial is given back as `preempted`, then the worker exits. A second signal exits at once."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from hpo.policy import ExecutionPolicy

from .capacity import Capacity, Footprint
from .client import Backoff, LeaseLost, ProtocolError, ServerClient, ServerUnavailable
from .command import DEFAULT_STOP_GRACE_SECONDS
from .confine import ConfinementError, RunAs
from .console import TrialLines
from .containment import Limits, mechanism
from .disk import DEFAULT_MIN_FREE_BYTES, DiskHealth, describe_free, names_the_disk
from .reporter import FLUSH_POINTS, FLUSH_SECONDS
from .runner import Outcome, create_board, launch, outcome_of_exception, remove_attempt_files
from .runs import (
    STOP_LEASE_LOST,
    STOP_PREEMPTED,
    STOP_REQUESTED,
    CommandRefused,
    JobSettings,
    Run,
    build_job,
    prepare_command,
)

_log = logging.getLogger("hpo.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs. `ray_address` None starts a local Ray instance (with `num_cpus` and
    `num_gpus` when given); otherwise it joins that cluster ("auto" finds one on this node)."""

    server_url: str  # one URL, or several servers sharing a database, comma-separated (ServerClient)
    artifact_root: Path = Path("./artifacts")
    token: str | None = None
    ray_address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    worker_id: str = field(default_factory=default_worker_id)
    max_trials: int | None = None
    idle_poll_seconds: float = 1.0
    tick_seconds: float = 0.1
    drain_seconds: float = 120.0
    exit_when_idle_seconds: float | None = None
    flush_points: int = FLUSH_POINTS
    flush_seconds: float = FLUSH_SECONDS
    warm_up: bool = True
    log_to_driver: bool = True
    object_store_memory: int | None = None
    trainer: str = "hpo.trainer:train"
    # What this worker's operator lets trials run besides the built-in workloads (hpo.policy).
    policy: ExecutionPolicy = field(default_factory=ExecutionPolicy)
    # `trainer.command` trials (docs/scripts.md): the root their `trainer.workdir` is relative to
    # (default: the current directory), and how long a stopped command gets before SIGKILL.
    workdir_root: Path | None = None
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    # Confinement (worker/confine.py, docs/security.md): trial processes run as this user or uid
    # range (None: the worker's user), and see these globs of the worker's environment beyond the
    # fixed allow-list.
    run_as: RunAs | None = None
    pass_env: tuple[str, ...] = ()
    # A worker running as root without `run_as` refuses to start unless told it may run trials as
    # root (`hpo worker --unconfined`; `hpo demo`, which runs only built-in workloads).
    unconfined: bool = False
    # The most one process of a trial may hold (worker/containment.py); a study asks for less.
    limits: Limits = field(default_factory=Limits)
    # Below this much free space in the artifact root the worker claims nothing (worker/disk.py).
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    disk_check_seconds: float = 10.0  # how often the artifact root is probed while claiming


def confinement_refusal(options: WorkerOptions) -> str | None:
    """Why this worker must not start as configured (docs/security.md), or None."""
    if os.geteuid() == 0 and options.run_as is None and not options.unconfined:
        return (
            "the worker runs as root without --run-as: trials would run as root and could read this node's "
            "files, the worker's token and Ray's credentials. Give them users of their own with "
            "--run-as FIRST-LAST (a uid range, one per running trial), or pass --unconfined to run them as root "
            "anyway (docs/security.md)"
        )
    run_as = options.run_as
    if run_as is not None and run_as.first == run_as.last and options.max_trials != 1:
        return (
            f"--run-as {run_as} is one user, so trials running side by side could reach each other: "
            "pass --max-trials 1, or a uid range (--run-as 20000-20063) for one uid per running trial"
        )
    return None


@dataclass
class WorkerStats:
    """What a worker did, for logs, the demo and the benchmark."""

    claimed: int = 0
    finished: int = 0
    max_running: int = 0
    # (trial_id, seconds from claim to the trial process starting, ... to its first training step),
    # the most recent 10,000 (a worker may live for months)
    latencies: deque[tuple[int, float | None, float | None]] = field(default_factory=lambda: deque(maxlen=10_000))


class Worker:
    """`Worker(options).run()` claims and runs trials until a signal (or `until()`) says stop."""

    def __init__(
        self, options: WorkerOptions, client: ServerClient | None = None, lines: TrialLines | None = None
    ) -> None:
        self.options = options
        self.lines = lines  # `hpo worker`'s one line per trial start and end
        self.client = client or ServerClient(options.server_url, options.token)
        self.stats = WorkerStats()
        self._runs: dict[int, Run] = {}
        self._wake = threading.Event()
        self._draining_since: float | None = None
        self._hard_stop = False
        self._next_claim = 0.0
        self._claim_delays = Backoff(initial=1.0, maximum=30.0).delays()
        self._idle_since = time.monotonic()
        self._owns_ray = False
        self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="hpo-ddp")
        self._capacity = Capacity(exclusive=True)
        self._jobs: JobSettings | None = None
        self.stopped_by_signal: int | None = None
        self._workdir_root = (options.workdir_root or Path.cwd()).absolute()
        self._returned: set[int] = set()  # trials this worker returned unrun once (worker/disk.py)
        self._disk = DiskHealth(
            options.artifact_root.absolute(), options.min_free_bytes, self._report_disk, options.disk_check_seconds
        )

    # -- public -------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] | None = None) -> int:
        """Runs until drained by a signal or `request_shutdown`, until `until()` is true with no
        trial left, or until idle for `exit_when_idle_seconds`. Answers an exit status. Raises
        ConfinementError before anything starts when the worker must not run as configured."""
        refusal = confinement_refusal(self.options)
        if refusal is not None:
            raise ConfinementError(refusal)
        self._connect()
        restore = self._install_signal_handlers()
        try:
            while not self._hard_stop and not self._finished(until):
                self._tick()
                self._wake.wait(self.options.tick_seconds)
                self._wake.clear()
        finally:
            restore()
            self._close()
        return 0

    def request_shutdown(self) -> None:
        """Drain: claim nothing more, stop every run (it checkpoints), give them back as
        `preempted`, then return from `run`. Called a second time, stop at once. Signal-safe."""
        if self._draining_since is not None:
            self._hard_stop = True
        else:
            self._draining_since = time.monotonic()
        self._wake.set()

    @property
    def running(self) -> int:
        return len(self._runs)

    # -- the loop -----------------------------------------------------------------------------

    def _tick(self) -> None:
        self._collect()
        self._heartbeat()
        if self._draining_since is not None:
            for run in self._runs.values():
                self._stop(run, STOP_PREEMPTED)
        else:
            self._claim_while_room()

    def _finished(self, until: Callable[[], bool] | None) -> bool:
        now = time.monotonic()
        if self._draining_since is not None:
            if not self._runs:
                return True
            if now - self._draining_since > self.options.drain_seconds:
                self._give_up_runs()
                return True
            return False
        if self._runs:
            return False
        if until is not None and until():
            return True
        idle = self.options.exit_when_idle_seconds
        return idle is not None and now - self._idle_since > idle

    def _collect(self) -> None:
        """Ends runs whose process ended: frees their resources, then tries the final call."""
        now = time.monotonic()
        for trial_id, run in list(self._runs.items()):
            if run.outcome is None and run.execution is not None and run.execution.done():
                run.outcome = self._unless_the_disk(run, run.execution.outcome())
                self._capacity.release(run.footprint)
                self._record_latency(run)
                self._next_claim = 0.0  # resources just freed: claim again at once
            if run.outcome is not None and now >= run.next_try and run.try_finish(self.client):
                del self._runs[trial_id]
                self.stats.finished += 1
                if self.lines is not None:
                    self.lines.finished(trial_id, self.client)
                self._idle_since = now

    def _heartbeat(self) -> None:
        now = time.monotonic()
        for run in self._runs.values():
            if now < run.next_heartbeat or run.stop_reason == STOP_LEASE_LOST:
                continue
            try:
                answer = self.client.heartbeat(run.trial_id, run.lease_id)
            except ServerUnavailable as exc:
                # Keep training; the lease may still be alive when the server returns.
                run.next_heartbeat = now + min(2.0, run.heartbeat_period)
                _log.warning("trial %d: heartbeat failed (%s); retrying", run.trial_id, exc)
                continue
            except ProtocolError as exc:  # 409 (LeaseLost) or the trial is gone: not ours any more
                _log.warning("trial %d: %s; stopping the run", run.trial_id, exc)
                self._stop(run, STOP_LEASE_LOST)
                continue
            run.next_heartbeat = now + run.heartbeat_period
            if answer.get("should_stop"):
                self._stop(run, STOP_REQUESTED)

    def _unless_the_disk(self, run: Run, outcome: Outcome) -> Outcome:
        """A failed attempt whose cause was this worker's disk (full, read-only) is the worker's
        fault, not the trial's: its files are removed and the trial is returned as if never claimed
        (docs/workers.md, "Worker health"); the worker claims nothing until the disk is fine."""
        if outcome.status != "error" or outcome.lease_lost:
            return outcome
        problem = self._disk.check(force=True)
        if problem is None and not names_the_disk(outcome.reason):
            return outcome
        remove_attempt_files(Path(run.job.out_dir))
        why = problem or f"the artifact root's disk ({describe_free(self._disk.root)})"
        self._disk.check(force=True)  # what the disk is like with the attempt's files gone
        if run.trial_id in self._returned:
            # The same trial filled the disk again: that is the trial's doing, and costs an attempt.
            return dataclasses.replace(outcome, reason=f"{why}\n\n{outcome.reason}")
        self._returned.add(run.trial_id)
        _log.warning("trial %d: returned unrun: %s", run.trial_id, why)
        return dataclasses.replace(outcome, status="returned", reason=f"{why}\n\n{outcome.reason}")

    def _report_disk(self, problem: str | None) -> None:
        if problem is None:
            _log.info("artifact root %s is writable; claiming", self._disk.root)
        else:
            _log.error("not claiming: %s", problem)
        try:
            self.client.report_health(self.options.worker_id, problem is None, problem or "")
        except (ServerUnavailable, ProtocolError) as exc:  # an older server, or none now: logged only
            _log.debug("could not report this worker's health: %s", exc)

    def _claim_while_room(self) -> None:
        if self._room_for_one_more() and self._disk.check() is not None:
            return  # said once, in one line, by _report_disk
        while time.monotonic() >= self._next_claim and self._room_for_one_more():
            cpus, gpus = self._capacity.offer()
            if cpus <= 0 and gpus <= 0:
                return
            try:
                claim = self.client.claim(self.options.worker_id, cpus, gpus, self.options.policy.capabilities())
            except (ServerUnavailable, ProtocolError) as exc:
                delay = next(self._claim_delays)
                self._next_claim = time.monotonic() + delay
                _log.warning("claim failed (%s); retrying in %.1f s", exc, delay)
                return
            self._claim_delays = Backoff(initial=1.0, maximum=30.0).delays()
            if claim is None:
                self._next_claim = time.monotonic() + self.options.idle_poll_seconds
                return
            self._start(claim)

    def _room_for_one_more(self) -> bool:
        limit = self.options.max_trials
        return limit is None or sum(run.outcome is None for run in self._runs.values()) < limit

    def _start(self, claim: dict[str, Any]) -> None:
        assert self._jobs is not None
        claimed_at = time.time()
        job = build_job(claim, self._jobs)
        footprint = Footprint(job.processes, job.cpus_per_process, job.gpus_per_process)
        run = Run(claim=claim, job=job, footprint=footprint, execution=None, claimed_at=claimed_at)
        run.next_heartbeat = time.monotonic() + run.heartbeat_period
        refusal = execution_refusal(job.config, self.options.policy)
        if refusal is None:
            try:
                run.job = job = prepare_command(job, self._workdir_root)
            except CommandRefused as exc:
                refusal = str(exc)
        if refusal is not None:
            # Before any import or process start: the operator has not allowed this code here.
            _log.warning("trial %d: refused: %s", job.trial_id, refusal)
            run.outcome = Outcome("config", refusal)
        else:
            try:
                run.execution = launch(job, self._pool)
                self._capacity.commit(footprint)
            except Exception as exc:  # Ray refused the task; the server retries it elsewhere
                _log.exception("trial %d: could not start", job.trial_id)
                run.outcome = outcome_of_exception(exc)
        self._runs[job.trial_id] = run
        self.stats.claimed += 1
        if self.lines is not None:
            self.lines.started(claim)
        self.stats.max_running = max(self.stats.max_running, sum(r.outcome is None for r in self._runs.values()))
        resumed = job.config["trainer"].get("resume_from")
        _log.info(
            "trial %d attempt %d claimed (%d x %.3g CPU, %.3g GPU)%s",
            job.trial_id,
            job.attempt,
            job.processes,
            job.cpus_per_process,
            job.gpus_per_process,
            f", resuming {resumed}" if resumed else "",
        )

    def _stop(self, run: Run, reason: str) -> None:
        if run.stop_reason is not None or run.outcome is not None:
            if reason == STOP_LEASE_LOST:
                run.stop_reason = reason  # a lost lease overrides: nothing more may be written
            return
        run.stop_reason = reason
        assert self._jobs is not None
        self._jobs.board.request_stop.remote(run.lease_id, reason)

    def _give_up_runs(self) -> None:
        """The drain deadline passed: give the leases back now (the runs resume from their newest
        recorded checkpoint) and leave; Ray ends the processes with this driver."""
        for run in self._runs.values():
            if run.stop_reason == STOP_LEASE_LOST:
                continue
            try:
                self.client.fail(run.trial_id, run.lease_id, "preempted", "worker shut down before the run stopped")
            except (ServerUnavailable, ProtocolError, LeaseLost) as exc:
                _log.warning("trial %d: could not give the lease back (%s); it will expire", run.trial_id, exc)

    def _record_latency(self, run: Run) -> None:
        outcome = run.outcome
        if outcome is None:
            return
        start = None if outcome.started_at is None else outcome.started_at - run.claimed_at
        first = None if outcome.first_step_at is None else outcome.first_step_at - run.claimed_at
        self.stats.latencies.append((run.trial_id, start, first))
        if first is not None:
            _log.info("trial %d: %s; claim to first step %.2f s", run.trial_id, outcome.status, first)

    # -- setup and teardown -------------------------------------------------------------------

    def _connect(self) -> None:
        opts = self.options
        if not ray.is_initialized():
            local: dict[str, Any] = {}
            if not opts.ray_address:  # sizes apply to a local instance only; Ray refuses them when joining
                local = {
                    "num_cpus": opts.num_cpus,
                    "num_gpus": opts.num_gpus,
                    "object_store_memory": opts.object_store_memory,
                }
                if os.geteuid() == 0:
                    local["_temp_dir"] = str(private_ray_temp_dir())
            ray.init(
                address=opts.ray_address,
                include_dashboard=False,
                log_to_driver=opts.log_to_driver,
                # without the trials' output, Ray's own INFO lines are noise too (`hpo worker -v` shows both)
                logging_level=logging.INFO if opts.log_to_driver else logging.ERROR,
                **local,
            )
            self._owns_ray = True
        _log.info(
            "trial processes: %s; each attempt ends by %s; at most %d processes%s",
            f"run as {opts.run_as}" if opts.run_as is not None else "run as this worker's user",
            mechanism(opts.run_as is not None),
            opts.limits.processes,
            f", {opts.limits.memory_bytes / 2**30:g} GiB" if opts.limits.memory_bytes else "",
        )
        if opts.run_as is not None:
            warn_if_ray_reachable()
        self._capacity = Capacity(exclusive=self._owns_ray and opts.ray_address is None)
        self._jobs = JobSettings(
            opts.artifact_root.absolute(),
            self.client,
            create_board(),
            opts.flush_points,
            opts.flush_seconds,
            opts.trainer,
            opts.stop_grace_seconds,
            opts.run_as,
            opts.pass_env,
            opts.limits,
        )
        # Ray Train's driver side, loaded here rather than inside the first DDP trial's start.
        importlib.import_module("ray.train.torch")
        if opts.warm_up:
            warm_up()
        self._idle_since = time.monotonic()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Remembered so `hpo worker` and `hpo demo` can exit 130 after a Ctrl-C (shell convention).
        self.stopped_by_signal = signum
        self.request_shutdown()

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in previous:
            signal.signal(sig, self._on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        if self._jobs is not None and ray.is_initialized():
            ray.kill(self._jobs.board)  # a driver that stays connected (tests, the demo) would keep it
        if self._owns_ray:
            ray.shutdown()


def execution_refusal(config: dict[str, Any], policy: ExecutionPolicy) -> str | None:
    """Why this worker's policy refuses what the trial's config would run, or None."""
    return policy.trainer_refusal(config.get("trainer") or {})


@ray.remote(num_cpus=1, max_retries=0)
def _warm() -> int:
    import hpo.worker.runner  # noqa: F401  (the import is the work: a trial's supervisor loads once per process)

    return os.getpid()


def warm_up(timeout: float = 60.0) -> None:
    """Starts one Ray worker process per CPU (up to 16) with a trial's supervisor imported, so a
    trial's own process starts at once after its claim (Ray reuses idle worker processes for the
    supervisors; trial code always gets a process of its own, worker/confine.py)."""
    slots = int(min(16, ray.cluster_resources().get("CPU", 1)))
    refs = [_warm.remote() for _ in range(max(1, slots))]
    ray.wait(refs, num_returns=len(refs), timeout=timeout)


def private_ray_temp_dir() -> Path:
    """Where a local Ray instance started by a root worker keeps its sockets and logs: below a
    root-owned 0700 folder, so no trial user can enter it (Ray makes its session folders 0777: a
    trial that could reach them could move the raylet's socket and cut the node off)."""
    import tempfile

    parent = Path(tempfile.gettempdir()) / "hpo-ray"
    parent.mkdir(mode=0o700, exist_ok=True)
    info = parent.lstat()
    if info.st_uid != 0 or not parent.is_dir() or parent.is_symlink():
        raise ConfinementError(f"{parent} must be a folder owned by root")
    os.chmod(parent, 0o700)
    return parent / "ray"


def warn_if_ray_reachable() -> None:
    """Warns when trial users could enter the folder of this node's Ray session (its sockets)."""
    try:
        session = Path(ray._private.worker._global_node.get_session_dir_path())  # type: ignore[attr-defined]
    except Exception:  # a Ray without this internal: nothing to check
        return
    for folder in [session, *session.parents]:
        try:
            info = folder.stat()
        except OSError:
            return
        if info.st_uid == 0 and not info.st_mode & 0o001:
            return  # a root folder others cannot pass through
    _log.warning(
        "trial users can reach this node's Ray session in %s (its sockets); start Ray with --temp-dir "
        "below a root-owned 0700 folder (docs/security.md)",
        session,
    )
