"""A user's program as the trainer: `trainer.command` (docs/scripts.md).

The worker runs the command once per attempt (once per process for DDP) and talks to it through
files only, so a script needs no import of hpo (Katib's file metrics collector is the model):

- in: `HPO_CONFIG`, a JSON file holding the claim's `config` plus `resume_from` (the newest
  checkpoint of an earlier attempt, or null), in the worker's own folder beside the attempt's
  (`attempt-<n>.worker/`, readable by the trial, never writable); `HPO_OUT_DIR`, the attempt's own
  folder; for DDP the
  `torchrun` environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
  `MASTER_ADDR`, `MASTER_PORT`).
- out: `{"step", "name", "value"}` lines appended to `$HPO_OUT_DIR/metrics.jsonl`; checkpoints as
  `$HPO_OUT_DIR/checkpoints/step-<N>[.ext]` (a file or a folder), complete once they appear under
  that name; `$HPO_OUT_DIR/result.json` `{"status": "infeasible", "reason": ...}`; the exit status.
- stop: SIGTERM to the command's process group asks it to checkpoint and exit; SIGKILL to the group
  follows after `stop_grace_seconds`.

Rank 0's runner tails the files through worker/trial_tree.py (never following a link the trial
planted): each point it accepts is appended to the worker's own `metrics.jsonl` in
`attempt-<n>.worker/`, which the worker's `HttpReporter` reads by offset (a server outage buffers on
disk), and goes to the `Reporter`; complete checkpoints are recorded and the `keep_best_checkpoints`
best plus the newest kept (the trainer's own retention rule). The command's stdout and stderr go to
`stdout.log` and `stderr.log` in the worker's folder. The command runs in its own session and its
own group (worker/containment.py: a cgroup, or its dedicated uid), so a stop reaches every process
it started and the end of the attempt ends them all; `PR_SET_PDEATHSIG` ends it if the process that
runs it dies (a SIGKILLed worker), so it never trains on for a lease that is gone. The command's
environment carries no `HPO_*` variable of the worker's (no API token): only `HPO_CONFIG` and
`HPO_OUT_DIR`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpo.collector_spec import CollectorSpec
from hpo.command_template import used_hyperparameters
from hpo.lifetime import die_with_parent
from hpo.session import PARAMS_READ_FILE
from hpo.trainer.config import Objective
from hpo.trainer.reporters import format_value, report_deleted
from hpo.trainer.retention import kept_steps

from .collectors import collector_for
from .confine import Identity, children_of, reap_children, trial_environment
from .containment import Containment, Limits, contain
from .reporter import MetricsTail
from .trial_tree import TrialTree, remove_tree

_log = logging.getLogger("hpo.worker.command")

METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
CONFIG_FILE = "hpo-config.json"
CHECKPOINT_DIR = "checkpoints"
STDOUT_FILE, STDERR_FILE = "stdout.log", "stderr.log"
# `step-<N>` or `step-<N>.<ext>` (`.pt`, `.tar.gz`): a complete checkpoint. Anything else in the
# folder (`.step-100.pt.tmp`, `step-100.pt.tmp123`, `tmp-...`) is a write in progress.
CHECKPOINT_NAME = re.compile(r"^step-(\d+)((?:\.[A-Za-z0-9_-]+){0,3})$")
# A part of the name that marks a write in progress: `.tmp`, `.tmp12345` (the built-in trainer's
# `step-N.pt.tmp<pid>`, renamed into place once written), `.temp`, `.part`, `.partial`, `.incomplete`.
_TEMPORARY = re.compile(r"(tmp|temp)\w*|part|partial|incomplete")

DEFAULT_STOP_GRACE_SECONDS = 30.0
DEFAULT_SILENCE_TIMEOUT_SECONDS = 1800.0
STDERR_TAIL_LINES = 30


class StopFlag(Protocol):
    def should_stop(self) -> bool: ...


class Sink(StopFlag, Protocol):
    """What rank 0's runner reports to (the trainer's `Reporter` contract)."""

    def metrics(self, step: int, values: dict[str, float]) -> None: ...

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None: ...


@dataclass(frozen=True)
class CommandSettings:
    """How one process of a command trial runs."""

    argv: tuple[str, ...]
    cwd: Path
    out_dir: Path
    rank: int = 0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # Confinement (worker/confine.py): the user the command runs as (None: the worker's), and the
    # operator's `--pass-env` globs of the worker's environment it may see.
    identity: Identity | None = None
    pass_env: tuple[str, ...] = ()
    # `trainer.metrics` (hpo.collector_spec): what rank 0 turns into metric points besides the
    # script's own metrics.jsonl.
    collector: CollectorSpec = field(default_factory=CollectorSpec)
    # The worker's own folder for this process (config, output, accepted points), beside the
    # attempt's and never the trial's to write; default `<out_dir>.worker`.
    log_dir: Path | None = None
    # What the attempt may hold (worker/containment.py), and its group's name on this node.
    limits: Limits = field(default_factory=Limits)
    stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS
    silence_timeout_seconds: float = DEFAULT_SILENCE_TIMEOUT_SECONDS
    poll_seconds: float = 0.05


@dataclass(frozen=True)
class CommandResult:
    """How the command ended, in the terms of an `Outcome` (status, reason, step)."""

    status: str
    reason: str = ""
    step: int | None = None
    unread_params: list[str] | None = None


def is_command(config: Mapping[str, Any]) -> bool:
    return bool((config.get("trainer") or {}).get("command"))


def resolve_workdir(root: Path, workdir: str | None) -> Path:
    """The command's working directory: `root/workdir`, which must exist and stay under `root`
    once symlinks are resolved. Raises ValueError with the reason."""
    base = root.resolve()
    path = (base / workdir).resolve() if workdir else base
    if not path.is_relative_to(base):
        raise ValueError(f"trainer.workdir {workdir!r} leads outside the worker's workdir root {base}")
    if not path.is_dir():
        raise ValueError(f"trainer.workdir {workdir!r}: {path} is not a directory on this worker")
    return path


def spec_environment(trainer: Mapping[str, Any], launcher: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a command gets beyond the allow-listed part of the worker's environment: the spec's
    `trainer.env` (checked against the operator's allow-list by hpo.policy on the server and the
    worker), under the launcher's torchrun variables, which it cannot override."""
    return {**{str(k): str(v) for k, v in (trainer.get("env") or {}).items()}, **(launcher or {})}


def checkpoint_step(name: str) -> int | None:
    """The step of a complete checkpoint's file or folder name, None for anything else."""
    match = CHECKPOINT_NAME.match(name)
    if match is None or any(_TEMPORARY.fullmatch(part.lower()) for part in match.group(2).split(".")):
        return None
    return int(match.group(1))


def checkpoints_in(tree: TrialTree, folder: str = CHECKPOINT_DIR) -> dict[int, str]:
    """Complete checkpoints (regular files or folders, never links) in a folder of the attempt, by
    step: their names (the newest name wins when two share a step)."""
    found: dict[int, str] = {}
    for name, info in sorted(tree.entries(folder).items()):
        step = checkpoint_step(name)
        if step is not None and (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            found[step] = name
    return found


def list_checkpoints(directory: Path) -> dict[int, Path]:
    """Complete checkpoints in `directory` by step, as paths."""
    if not directory.is_dir():
        return {}
    with TrialTree.open(directory) as tree:
        return {step: directory / name for step, name in checkpoints_in(tree, ".").items()}


def worker_dir(out_dir: Path) -> Path:
    """The worker's own folder beside an attempt's (`attempt-<n>.worker`)."""
    return out_dir.with_name(out_dir.name + ".worker")


def write_config(folder: Path, config: Mapping[str, Any], group: int | None = None) -> Path:
    """`HPO_CONFIG`: the claim's config with `resume_from` at the top (a path, or null), in the
    worker's folder; readable by the trial's group `group` (None: by everyone)."""
    data = dict(config)
    trainer = dict(data.get("trainer") or {})
    data["resume_from"] = trainer.get("resume_from")
    path = folder / CONFIG_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False, default=str))
    _readable_by(tmp, group)
    os.replace(tmp, path)
    return path


def make_worker_dir(folder: Path, group: int | None) -> None:
    """The worker's folder: made by the worker, entered by the trial's group only (to read its
    config), written by nobody else."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755 if group is None else 0o750)
    if group is not None and os.geteuid() == 0:
        os.chown(folder, 0, group)


def _readable_by(path: Path, group: int | None) -> None:
    os.chmod(path, 0o644 if group is None else 0o640)
    if group is not None and os.geteuid() == 0:
        os.chown(path, 0, group)


class CommandRun:
    """One process of a command trial, from start to a `CommandResult`. `sink` (rank 0 only) gets
    the points and checkpoints; `stop` is polled for stop requests (the driver's board)."""

    def __init__(self, settings: CommandSettings, config: Mapping[str, Any], stop: StopFlag, sink: Sink | None) -> None:
        self.s, self.config, self.stop, self.sink = settings, config, stop, sink
        trainer = dict(config.get("trainer") or {})
        objective = dict(config.get("objective") or {})
        self.objective_metric = str(objective.get("metric", "valid/error_rate"))
        self.objective_mode = str(objective.get("mode", "min"))
        self.keep_best = int(trainer.get("keep_best_checkpoints", 3))
        self.log_dir = settings.log_dir or worker_dir(settings.out_dir)
        # Opened by `run`, before the trial gets its folder; everything below it is read through it.
        self.tree: TrialTree | None = None
        self.tail = MetricsTail(settings.out_dir / METRICS_FILE, opener=lambda: self._tree.open_file(METRICS_FILE))
        self.accepted: Any = None  # the worker's own metrics.jsonl, which the HttpReporter tails
        collector = collector_for(settings.collector, lambda: self._tree, self.log_dir / STDOUT_FILE)
        self.collector = collector if sink is not None else None
        self.containment: Containment | None = None
        self.names: set[str] = set()  # metric names the command wrote
        self.ckpt_dir = settings.out_dir / CHECKPOINT_DIR
        self.objectives: dict[int, float] = {}
        self.recorded: set[int] = set()  # checkpoint steps seen
        self.told: set[int] = set()  # ... and reported to the sink, while their files exist
        self.points = 0
        self.last_step: int | None = None
        self.last_activity = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self._present: set[int] = set()  # this process's children before the command started

    # -- the run ---------------------------------------------------------------------------------

    @property
    def _tree(self) -> TrialTree:
        assert self.tree is not None, "the attempt folder is opened by run()"
        return self.tree

    def run(self) -> CommandResult:
        identity = self.s.identity
        # A folder of this attempt can only be left from an attempt returned unrun (worker/disk.py):
        # the attempt starts clean. Of the worker's folder only this process's own files go: Ray
        # Train keeps its records there, made before any rank starts.
        remove_tree(self.s.out_dir)
        for name in (CONFIG_FILE, STDOUT_FILE, STDERR_FILE, METRICS_FILE):
            (self.log_dir / name).unlink(missing_ok=True)
        self.tree = TrialTree.create(self.s.out_dir)
        try:
            self._present = set(children_of(os.getpid()))
            name = f"{self.s.out_dir.parent.name}-{self.s.out_dir.name}-{os.getpid()}"
            self.containment = contain(name, self.s.limits, None if identity is None else identity.uid)
            try:
                self.start()
                stop_reason, kill_at = self.supervise()
                returncode = self._wait_and_reap(kill_at)
                self._end_processes()
                self.poll_files()
            finally:
                # Whatever happened, nothing the command started outlives the attempt, and its
                # files are nobody's to write once it is over (worker/containment.py).
                self._end_processes()
                self.tree.seal(None if identity is None else identity.uid)
            result = self.verdict(returncode, stop_reason)
            if self.sink is not None:
                unread = unread_hyperparameters(self.tree, self.config)
                result = dataclasses.replace(result, unread_params=unread)
            return result
        finally:
            self.tree.close()
            if self.accepted is not None:
                self.accepted.close()
            if self.collector is not None:
                self.collector.close()  # TensorBoard event files: a descriptor each

    def _end_processes(self) -> None:
        assert self.containment is not None
        try:
            self.containment.end(self._present)
        finally:
            reap_children(self._present)

    def start(self) -> None:
        out, identity = self.s.out_dir, self.s.identity
        group = None if identity is None else identity.gid
        make_worker_dir(self.log_dir, group)
        config_path = write_config(self.log_dir, self.config, group)
        ours = {"HPO_CONFIG": str(config_path), "HPO_OUT_DIR": str(out)}
        env = trial_environment(os.environ, {**self.s.extra_env, **ours}, self.s.pass_env, identity)
        if self.sink is not None:
            self.accepted = (self.log_dir / METRICS_FILE).open("ab")
        assert self.containment is not None
        setup = functools.partial(_child_setup, node_niceness(), self.containment.join, identity)
        # Output goes to the worker's files, not pipes: nothing to drain, and the tail survives for
        # the failure reason, in a folder the trial cannot change.
        with (self.log_dir / STDOUT_FILE).open("ab") as stdout, (self.log_dir / STDERR_FILE).open("ab") as stderr:
            if identity is not None:
                self._tree.hand_over(identity.uid, identity.gid)
            self.proc = subprocess.Popen(
                list(self.s.argv),
                cwd=self.s.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=setup,
            )
        self.last_activity = time.monotonic()

    def supervise(self) -> tuple[str | None, float | None]:
        """Polls until the command's main process exits. Answers why it was stopped (None when it
        ended by itself) and when to SIGKILL the group if it is still there."""
        assert self.proc is not None
        stop_reason: str | None = None
        kill_at: float | None = None
        silence = self.s.silence_timeout_seconds
        while self.proc.poll() is None:
            # Orphans of the trial are re-parented to this supervisor (a subreaper): reaped as they
            # die, or their zombies would count against the attempt's process limit.
            reap_children(self._present | {self.proc.pid})
            if self.sink is not None and self.poll_files():
                self.last_activity = time.monotonic()
            now = time.monotonic()
            if stop_reason is None:
                if self.stop.should_stop():
                    stop_reason = "stop"
                elif self.sink is not None and now - self.last_activity > silence:
                    stop_reason = "silent"
                if stop_reason is not None:
                    self.signal_group(signal.SIGTERM)
                    kill_at = now + self.s.stop_grace_seconds
            elif kill_at is not None and now >= kill_at:
                self.signal_group(signal.SIGKILL)
                kill_at = None
            time.sleep(self.s.poll_seconds)
        return stop_reason, kill_at

    def _wait_and_reap(self, kill_at: float | None) -> int:
        """The main process's exit status; whatever else is left in its process group (children
        that outlived it) is killed now, and `run` kills every other descendant after: the trial
        is over."""
        assert self.proc is not None
        returncode = self.proc.wait()
        self.signal_group(signal.SIGKILL)
        return returncode

    def signal_group(self, signum: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    # -- files -----------------------------------------------------------------------------------

    def poll_files(self) -> bool:
        """Reads new metric points and complete checkpoints; True when there was anything new.
        Checkpoint records follow the files: a recorded checkpoint that is gone (retention here,
        or the script's own, such as Lightning's `save_top_k`) is reported deleted, so the server
        never offers it as a resume point (docs/scripts.md, "Framework callbacks")."""
        if self.sink is None:
            return False
        collected = self.collector.collect() if self.collector is not None else []
        new = self._read_points(collected)
        present = checkpoints_in(self._tree)
        found = {step: name for step, name in present.items() if step not in self.recorded}
        if found:
            self.recorded.update(found)
            if self._prune(present):
                present = checkpoints_in(self._tree)
        gone = sorted(self.told - set(present))
        if gone:
            self.told -= set(gone)
            report_deleted(self.sink, gone)
        # Like the trainer, record only what retention keeps (the newest always is); several
        # checkpoints that appeared between two polls may leave only the best of them.
        for step in sorted(found):
            if step in present:
                self.sink.checkpoint(step, str(self.ckpt_dir / present[step]), self.objectives.get(step))
                self.told.add(step)
        return new or bool(found) or bool(gone)

    def _read_points(self, collected: list[tuple[int, str, float]]) -> bool:
        """Takes the collector's points and the new lines of the trial's own metrics.jsonl, appends
        them to the worker's file (which the reporter delivers) and tells the sink."""
        assert self.sink is not None
        got = bool(collected)
        if collected:
            self._accept([{"step": step, "name": name, "value": value} for step, name, value in collected])
        while True:
            points, end = self.tail.read()
            self.tail.advance(end)
            if not points:
                return got
            got = True
            self._accept(points)

    def _accept(self, points: list[dict[str, Any]]) -> None:
        assert self.sink is not None and self.accepted is not None
        self.accepted.write("".join(point_line(p["step"], p["name"], p["value"]) for p in points).encode())
        self.accepted.flush()
        for point in points:
            step, name, value = point["step"], point["name"], point["value"]
            self.points += 1
            self.names.add(name)
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            if name == self.objective_metric and value == value:
                self.objectives[step] = value
            self.sink.metrics(step, {name: value})

    def _prune(self, present: dict[int, str]) -> bool:
        """The trainer's retention: the `keep_best` best checkpoints by the objective and the newest;
        and the newest one the server recorded, which a later attempt would resume from (during a
        server outage the script goes on checkpointing, and none of the newer ones is recorded).
        Answers whether it deleted anything."""
        keep = kept_steps(
            {step: self.objectives.get(step) for step in present},
            self.keep_best,
            Objective(self.objective_metric, self.objective_mode),
        )
        recorded = getattr(self.sink, "newest_recorded", None)
        if recorded is not None:
            keep.add(recorded)
        # Only inside the attempt's own checkpoints folder, by name, never through a link.
        doomed = [name for step, name in present.items() if step not in keep and step in self.recorded]
        for name in doomed:
            self._tree.remove(CHECKPOINT_DIR, name)
        return bool(doomed)

    # -- the answer ------------------------------------------------------------------------------

    def verdict(self, returncode: int, stop_reason: str | None) -> CommandResult:
        step = self.last_step
        declared = parse_result(self._tree.read_bytes(RESULT_FILE, 64 * 1024))
        declared_error = None
        if declared is not None and declared[0] == "error":
            declared_error = declared[1]  # the program's own account of its failure (a traceback)
        elif declared is not None:
            return CommandResult(declared[0], declared[1], step)
        if stop_reason == "stop":
            return CommandResult("stopped", "stopped on request", step)
        if stop_reason == "silent":
            return CommandResult(
                "error",
                f"the command wrote no metric point and no checkpoint for {self.s.silence_timeout_seconds:g} s "
                f"(trainer.silence_timeout_seconds), so it was stopped{self._stderr_tail()}",
                step,
            )
        if declared_error is not None:
            return CommandResult("error", declared_error, step)
        if returncode == 0:
            resumed = (self.config.get("trainer") or {}).get("resume_from")
            if self.sink is not None and self.points == 0 and not resumed:
                # Retrying cannot help: the script does not follow the file protocol. (A resumed
                # attempt may have nothing left to do: its checkpoint was taken at the last step.)
                return CommandResult(
                    "config",
                    f"the command exited with status 0 but wrote no metric point to $HPO_OUT_DIR/{METRICS_FILE} "
                    f"{self._collector_hint()}(see docs/scripts.md){self._stderr_tail()}",
                    step,
                )
            if self.sink is not None and self.objective_metric not in self.names and not resumed:
                # The study's objective would be empty: every conclusion on this trial would be
                # "infeasible" with no reason. Retrying cannot help either.
                wrote = ", ".join(sorted(self.names)[:20])
                return CommandResult(
                    "config",
                    f"the command completed without writing the objective metric {self.objective_metric!r}; "
                    f"it wrote {wrote} (name the objective as the script writes it, or alias it: docs/scripts.md)",
                    step,
                )
            return CommandResult("completed", "", step)
        return CommandResult("error", f"the command {describe_exit(returncode)}{self._stderr_tail()}", step)

    def _collector_hint(self) -> str:
        if self.s.collector.collector == "file":
            return 'nor printed points for a collector (set trainer.metrics to "stdout" or "tensorboard") '
        return f"and its {self.s.collector.collector} collector found none "

    def _stderr_tail(self) -> str:
        # The worker's own file, which the trial reached only through the descriptor it inherited.
        lines = stderr_tail(self.log_dir / STDERR_FILE)
        return f"; last lines of its stderr:\n{lines}" if lines else ""


def unread_hyperparameters(tree: TrialTree, config: Mapping[str, Any]) -> list[str] | None:
    """The trial's hyperparameters that reached the script neither through a placeholder of
    `trainer.command` nor through `hpo.session().params` (the `params_read.json` it writes at
    exit); None when the trial uses neither, so nothing is known (a script that reads $HPO_CONFIG
    by itself). The file is the script's: only names the trial has count."""
    params = dict(config.get("params") or {})
    command = [str(a) for a in (config.get("trainer") or {}).get("command") or []]
    if not params or not command:
        return None
    # Only a command that passes hyperparameters by placeholder says anything about the others
    # (`{python}` or `{out_dir}` alone do not: the script may read $HPO_CONFIG itself).
    passed = used_hyperparameters(command, params) or None
    read = _session_reads(tree.read_bytes(PARAMS_READ_FILE, 1 << 20))
    if passed is None and read is None:
        return None
    reached = (passed or set()) | (read or set())
    return sorted(name for name in params if name not in reached)


def _session_reads(data: bytes | None) -> set[str] | None:
    try:
        raw = json.loads(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("read"), list):
        return None
    return {name for name in raw["read"] if isinstance(name, str)}


def read_result(path: Path) -> tuple[str, str] | None:
    """`parse_result` of a file by path (for a folder the caller owns)."""
    try:
        return parse_result(path.read_bytes())
    except OSError:
        return None


def parse_result(data: bytes | None) -> tuple[str, str] | None:
    """`(status, reason)` when `result.json` says `{"status": "infeasible"}` (a property of the
    point: never retried), `{"status": "config"}` (the program refuses its configuration: never
    retried either) or `{"status": "error"}` (the program's account of its failure: retried, unless
    a stop request explains the end); None otherwise (the exit status decides)."""
    try:
        raw = json.loads(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    if raw.get("status") == "infeasible":
        return "infeasible", str(raw.get("reason") or "the script reported the point infeasible")[:8000]
    if raw.get("status") == "config":
        return "config", str(raw.get("reason") or "the script refused its configuration")[:8000]
    if raw.get("status") == "error" and raw.get("reason"):
        return "error", str(raw["reason"])[:12000]
    return None


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES, limit: int = 8000) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 64 * 1024))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip()
    return "\n".join(text.splitlines()[-lines:])[-limit:]


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def node_niceness() -> int | None:
    """The scheduling priority of this node's raylet. Ray runs its worker processes at niceness 15
    so that its control plane stays responsive; a user's script should run as it would by hand, so
    on a busy node it gets the CPU share of the raylet's priority (on a loaded 2-core machine, a
    script at niceness 15 ran at half its speed by hand). None outside Ray."""
    raylet = os.environ.get("RAY_RAYLET_PID")
    if not raylet:
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, int(raylet))
    except (OSError, ValueError):
        return None


def _child_setup(niceness: int | None, join: Callable[[], None], identity: Identity | None) -> None:
    """In the child before exec, in this order: into the attempt's group (as root, so nothing the
    program starts is ever outside it), the node's niceness (raising a priority needs root too),
    then the trial's user, then SIGKILL when the process that started it dies (after the change of
    user, which clears it)."""
    join()
    if niceness is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    if identity is not None:
        os.setgroups([])
        os.setresgid(identity.gid, identity.gid, identity.gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)
    die_with_parent(signal.SIGKILL)


def point_line(step: int, name: str, value: float) -> str:
    """One `{"step", "name", "value"}` line of a metrics.jsonl (NaN and infinities as the trainer
    writes them)."""
    return f'{{"step": {int(step)}, "name": {json.dumps(str(name))}, "value": {format_value(value)}}}\n'
