"""Ending an attempt whole, and bounding what it may hold (docs/security.md, "What a trial's code
can reach").

A scan of `/proc` followed by signals can be outrun: a process that forks and exits within
milliseconds is never where the scan saw it. The kernel offers two ways that cannot be outrun, and
the worker uses the first this node allows, saying at start which:

- **cgroup v2**, where `/sys/fs/cgroup` is the unified hierarchy and the worker may create groups:
  a group per attempt with `pids.max` and `memory.max` (when those controllers are enabled), ended
  by writing `1` to `cgroup.kill`.
- **cgroup v1** (`pids` and `freezer` hierarchies writable by root, as on hosts and containers that
  still mount v1): a group per attempt in each, `pids.max` (and `memory.limit_in_bytes` in the
  `memory` hierarchy when present); ended as runc ends a v1 container: freeze the group, SIGKILL
  every task listed, thaw, until the group is empty.
- **the trial's uid** (`--run-as` without a writable cgroup): a helper process running as that uid
  calls `kill(-1, SIGKILL)`, which the kernel applies to every process of the uid at once, until no
  process of the uid is left; the uid is not handed to another trial before that holds
  (worker/confine.py keeps its lock). `RLIMIT_NPROC` bounds its processes instead of `pids.max`,
  `RLIMIT_AS` each process's address space instead of the group's memory.
- **the process tree** (no root, no `--run-as`: an unconfined worker): what `confine.kill_descendants`
  finds below the supervisor, best effort.

A trial joins its group in its own process, before it drops root and executes the program
(`join`, called from the child's setup), so nothing it starts is ever outside the group.

Standard library only."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .confine import ContainmentFailed, kill_descendants

_log = logging.getLogger("hpo.worker.containment")

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PARENT = "hpo-trials"  # every attempt's group sits below this one in each hierarchy

DEFAULT_MAX_PROCESSES = 4096
MAX_PROCESSES_CAP = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one attempt may hold: processes and threads (`pids.max`, or `RLIMIT_NPROC` per uid),
    and memory in bytes (None: not limited by hpo)."""

    processes: int = DEFAULT_MAX_PROCESSES
    memory_bytes: int | None = None

    def within(self, processes: int | None, memory_bytes: int | None) -> Limits:
        """A study's own limits (`resources.max_processes`, `resources.memory_gb`) inside these,
        the operator's maximum."""
        memory = [limit for limit in (self.memory_bytes, memory_bytes) if limit]
        return Limits(min(self.processes, processes or self.processes), min(memory) if memory else None)


class Containment(Protocol):
    """One attempt's processes, as one thing to end."""

    mechanism: str

    def join(self) -> None:
        """In the trial's own process, before it drops root and execs: enter the group."""
        ...

    def end(self, spare: Iterable[int] = ()) -> None:
        """Kills every process of the attempt; returns once none is left (raises
        ContainmentFailed otherwise). `spare`: the supervisor's children from before the attempt.
        The caller reaps what was re-parented to it (`confine.reap_children`)."""
        ...


# -- choosing -----------------------------------------------------------------------------------


def mechanism(run_as: bool) -> str:
    """The name of what ends an attempt on this node, for the worker's start-up line and docs."""
    if os.geteuid() == 0 and _v2_usable():
        return "cgroup v2 (cgroup.kill, pids.max, memory.max)"
    if os.geteuid() == 0 and _v1_usable():
        return "cgroup v1 (freezer, pids.max" + (", memory limit)" if _v1_dir("memory") else ")")
    if run_as:
        return "the trial's dedicated uid (kill(-1) as that uid, RLIMIT_NPROC)"
    return "the process tree (unconfined: best effort, docs/security.md)"


def contain(name: str, limits: Limits, uid: int | None) -> Containment:
    """A fresh group (or the fallback) for one attempt; `name` must be unique on the node while
    the attempt runs (it names the cgroup)."""
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            if _v2_usable():
                return CgroupV2(name, limits, uid)
            if _v1_usable():
                return CgroupV1(name, limits, uid)
    if uid is not None:
        return UidKill(uid, limits)
    return ProcessTree()


def _v2_usable() -> bool:
    """`/sys/fs/cgroup` is the unified hierarchy with the pids controller for our groups."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if not controllers.exists():
        return False
    try:
        return "pids" in controllers.read_text().split() and os.access(CGROUP_ROOT, os.W_OK)
    except OSError:
        return False


def _v1_dir(controller: str) -> Path | None:
    """Where this process sits in the v1 hierarchy of `controller`, when root may make groups
    there: attempts' groups nest under the worker's own, so the limits the worker runs under (a
    container's memory limit) hold for its trials too."""
    hierarchy = CGROUP_ROOT / controller
    if not (hierarchy / "cgroup.procs").exists() or (hierarchy / "cgroup.controllers").exists():
        return None
    own = "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                own = path
    base = hierarchy / own.lstrip("/")
    return base if base.is_dir() and os.access(base, os.W_OK) else None


def _v1_usable() -> bool:
    return _v1_dir("pids") is not None and _v1_dir("freezer") is not None


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _pids(procs: Path) -> list[int]:
    try:
        return [int(line) for line in procs.read_text().split()]
    except (OSError, ValueError):
        return []


def _join_in_child(procs_files: list[Path]) -> None:
    """In the forked child, before exec: async-signal-safe enough (plain writes, no allocation of
    locks shared with the parent's threads)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def _rmdir(path: Path, deadline: float) -> None:
    """Removes an emptied group; the kernel may take a moment to let go of the last task."""
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                _log.warning("cgroup %s could not be removed", path)
                return
            time.sleep(0.01)


class CgroupV2:
    """A group per attempt in the unified hierarchy: `cgroup.kill` ends it at once."""

    def __init__(self, name: str, limits: Limits, uid: int | None) -> None:
        self.mechanism = "cgroup v2"
        parent = CGROUP_ROOT / GROUP_PARENT
        parent.mkdir(exist_ok=True)
        available = (parent / "cgroup.controllers").read_text().split()
        wanted = [c for c in ("pids", "memory") if c in available]
        with contextlib.suppress(OSError):
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        self.path = parent / name
        self.path.mkdir()
        if (self.path / "pids.max").exists():
            _write(self.path / "pids.max", str(limits.processes))
        if limits.memory_bytes and (self.path / "memory.max").exists():
            _write(self.path / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                _write(self.path / "memory.swap.max", "0")
        self.uid = uid

    def join(self) -> None:
        _join_in_child([self.path / "cgroup.procs"])

    def end(self, spare: Iterable[int] = (), timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        procs = self.path / "cgroup.procs"
        while _pids(procs):
            if (self.path / "cgroup.kill").exists():
                _write(self.path / "cgroup.kill", "1")
            else:  # kernels before 5.14: freeze, kill what is listed, thaw
                _freeze_kill_thaw(self.path / "cgroup.freeze", "1", "0", procs, self.path / "cgroup.events", "frozen 1")
            if time.monotonic() > deadline:
                raise ContainmentFailed(f"processes {_pids(procs)} of {self.path} survived cgroup.kill")
            time.sleep(0.01)
        _rmdir(self.path, deadline)
        if self.uid is not None:
            end_uid(self.uid, max(1.0, deadline - time.monotonic()))


class CgroupV1:
    """A group per attempt in the v1 `pids`, `freezer` (and `memory`) hierarchies."""

    def __init__(self, name: str, limits: Limits, uid: int | None) -> None:
        self.mechanism = "cgroup v1"
        self.groups: dict[str, Path] = {}
        try:
            for controller in ("freezer", "pids", "memory"):
                base = _v1_dir(controller)
                if base is None:
                    continue
                group = base / GROUP_PARENT / name
                group.mkdir(parents=True)
                self.groups[controller] = group
            _write(self.groups["pids"] / "pids.max", str(limits.processes))
            if limits.memory_bytes and "memory" in self.groups:
                _write(self.groups["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
        except OSError:
            self._remove(time.monotonic())
            raise
        self.uid = uid

    def join(self) -> None:
        _join_in_child([group / "cgroup.procs" for group in self.groups.values()])

    def end(self, spare: Iterable[int] = (), timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        freezer = self.groups["freezer"]
        procs = freezer / "cgroup.procs"
        while _pids(procs):
            _freeze_kill_thaw(freezer / "freezer.state", "FROZEN", "THAWED", procs, freezer / "freezer.state", "FROZEN")
            if time.monotonic() > deadline:
                raise ContainmentFailed(f"processes {_pids(procs)} of {freezer} survived the freezer")
            time.sleep(0.01)
        self._remove(deadline)
        if self.uid is not None:  # nothing of the uid may live outside the group either
            end_uid(self.uid, max(1.0, deadline - time.monotonic()))

    def _remove(self, deadline: float) -> None:
        for group in self.groups.values():
            _rmdir(group, deadline)


def _freeze_kill_thaw(state: Path, frozen: str, thawed: str, procs: Path, check: Path, done: str) -> None:
    """Freezes the group (no task of it can fork or run), SIGKILLs every task listed, thaws it so
    the signals are delivered."""
    with contextlib.suppress(OSError):
        _write(state, frozen)
        for _ in range(200):  # a freeze completes in microseconds; FREEZING while tasks settle
            if done in check.read_text().splitlines():
                break
            time.sleep(0.001)
    for pid in _pids(procs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        _write(state, thawed)


class UidKill:
    """No cgroup: the trial's uid is its own (worker/confine.py hands each running trial one), so
    every process of that uid is the attempt's."""

    def __init__(self, uid: int, limits: Limits) -> None:
        self.mechanism = "uid"
        self.uid, self.limits = uid, limits

    def join(self) -> None:
        # Counted per uid by the kernel, which is the trial's alone: the whole attempt's processes.
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        limit = self.limits.processes if hard == resource.RLIM_INFINITY else min(hard, self.limits.processes)
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
        if self.limits.memory_bytes:
            # Address space per process, not memory per attempt: the nearest a node without a
            # cgroup offers (CUDA maps far more address space than it uses: docs/security.md).
            resource.setrlimit(resource.RLIMIT_AS, (self.limits.memory_bytes, self.limits.memory_bytes))

    def end(self, spare: Iterable[int] = (), timeout: float = 30.0) -> None:
        end_uid(self.uid, timeout)


def end_uid(uid: int, timeout: float = 30.0) -> None:
    """Kills every process of `uid` and returns once none is alive (zombies aside, which their
    parents or this supervisor reap); raises ContainmentFailed after `timeout`."""
    if uid == 0:
        raise ValueError("never end uid 0")
    deadline = time.monotonic() + timeout
    # At least one kill first: a scan of /proc can miss a hopping process. Once one kill(-1) has
    # run, no process of the uid can start (the kernel fails a fork whose parent has SIGKILL
    # pending), so a scan that finds none afterwards is right.
    while True:
        helper = os.fork()
        if helper == 0:  # pragma: no cover (the child)
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                for _ in range(100):
                    try:
                        os.kill(-1, signal.SIGKILL)  # every process of this uid but this one, at once
                    except ProcessLookupError:
                        break
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
        time.sleep(0.005)
        if not alive_of_uid(uid):
            return
        if time.monotonic() > deadline:
            raise ContainmentFailed(f"processes of uid {uid} survived kill(-1): {alive_of_uid(uid)}")


def alive_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` and that are not zombies (from /proc: only to check that
    none is left, never to choose what to kill)."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as handle:
                status = handle.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if int(fields.get(b"Uid", b"-1 0").split()[0]) == uid and not fields.get(b"State", b"").strip().startswith(
            b"Z"
        ):
            found.append(int(entry.name))
    return found


class ProcessTree:
    """An unconfined worker (no root, no `--run-as`): every descendant of the supervisor, found in
    /proc, stopped and killed. A process that outruns the scan can survive; docs/security.md says so."""

    def __init__(self) -> None:
        self.mechanism = "process tree"

    def join(self) -> None:
        return None

    def end(self, spare: Iterable[int] = (), timeout: float = 30.0) -> None:
        kill_descendants(spare=spare)
