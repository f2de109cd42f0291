"""A trial's processes are its own (docs/security.md, "What a trial's code can reach").

Every attempt's code runs in processes that hpo starts for it (never in a Ray worker process, which
Ray reuses and which holds a connection to the cluster), with an environment built from an
allow-list, optionally as a user of its own, and every one of them is killed when the attempt ends:

- `trial_environment`: what a trial process sees of the worker's environment. An allow-list, not
  the worker's environment minus a few names: a node's environment carries credentials
  (`RAY_AUTH_TOKEN`, cloud keys, the operator's own) that no list of names to remove can foresee.
- `RunAs` / `Identity`: `hpo worker --run-as` runs trial processes as another user (a name, or a
  range of uids with one uid per running trial on this node, so concurrent trials cannot signal,
  trace or write each other either). Needs a worker running as root.
- `kill_descendants`: the supervisor is a child subreaper (hpo.lifetime.become_subreaper), so a
  process that `setsid`s and double-forks is re-parented to it and reaped here. Ending an attempt
  is worker/containment.py's (a cgroup, or the trial's dedicated uid); the scan of the process tree
  is only the unconfined worker's best effort.
- The attempt's folder, handed to the trial's user and sealed afterwards: worker/trial_tree.py.

Standard library only; Linux (elsewhere the process-tree parts find nothing and do nothing)."""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import pwd
import re
import signal
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpo.policy import DEVICE_ENV

# Names a trial process inherits from the worker's environment when set there: the locale, the
# search path for programs, and what Ray sets for this task's devices and thread counts. Anything
# else only when the operator passes it with `--pass-env` (e.g. `NCCL_SOCKET_IFNAME`, `HF_HOME`).
INHERITED_ENV = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    *DEVICE_ENV,
    "*_NUM_THREADS",
)
# Never inherited, whatever `--pass-env` says: hpo's and Ray's own settings and credentials.
_NEVER_INHERITED = ("HPO_*", "RAY_*")


class ConfinementError(RuntimeError):
    """The worker cannot confine a trial as asked (no uid free, not root for --run-as)."""


class ContainmentFailed(RuntimeError):
    """Processes of an attempt are still alive after everything that should have ended them: its
    uid stays taken (worker/containment.py)."""


# Locks of uids whose last attempt left processes behind: held until the worker exits, so no other
# trial is handed a uid that still runs someone's code.
_QUARANTINED: list[int] = []


def trial_environment(
    worker_env: Mapping[str, str],
    extra: Mapping[str, str],
    pass_globs: Iterable[str] = (),
    identity: Identity | None = None,
) -> dict[str, str]:
    """The environment of a trial process: the allow-listed part of `worker_env`, `HOME`/`USER`
    of the trial's user (or the worker's, without `--run-as`), then `extra` (the spec's
    `trainer.env`, already checked, and hpo's own `HPO_CONFIG`, `HPO_OUT_DIR`, launcher variables)."""
    patterns = INHERITED_ENV + tuple(pass_globs)
    env = {
        name: value
        for name, value in worker_env.items()
        if any(fnmatch.fnmatchcase(name, p) for p in patterns)
        and not any(fnmatch.fnmatchcase(name, p) for p in _NEVER_INHERITED)
    }
    if identity is None:
        for name in ("HOME", "USER", "LOGNAME"):
            if name in worker_env:
                env[name] = worker_env[name]
    else:
        env.update(HOME=identity.home, USER=identity.name, LOGNAME=identity.name)
    env.update(extra)
    return env


# -- running as another user --------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """The user a trial's processes run as."""

    uid: int
    gid: int
    name: str
    home: str


@dataclass(frozen=True)
class RunAs:
    """`--run-as`: one user (`trainer` or `1234`), shared by the node's concurrent trials, or a
    range of uids (`20000-20063`), one per running trial on this node, taken under a lock file."""

    first: int
    last: int
    name: str | None = None
    gid: int | None = None
    home: str | None = None

    @classmethod
    def parse(cls, text: str) -> RunAs:
        """Raises ValueError naming what is wrong."""
        text = text.strip()
        span = re.fullmatch(r"(\d+)-(\d+)", text)
        if span:
            first, last = int(span.group(1)), int(span.group(2))
            if not 0 < first <= last < 2**31 or last - first > 65535:
                raise ValueError(f"--run-as {text!r}: a uid range must be 1 <= FIRST <= LAST, at most 65,536 uids")
            return cls(first, last)
        try:
            entry = pwd.getpwuid(int(text)) if text.isdigit() else pwd.getpwnam(text)
        except (KeyError, OverflowError):
            raise ValueError(f"--run-as {text!r}: no such user on this node") from None
        if entry.pw_uid == 0:
            raise ValueError("--run-as: trials must not run as root")
        return cls(entry.pw_uid, entry.pw_uid, entry.pw_name, entry.pw_gid, entry.pw_dir)

    def __str__(self) -> str:
        return self.name or (str(self.first) if self.first == self.last else f"{self.first}-{self.last}")

    @contextlib.contextmanager
    def take(self, lock_dir: Path | None = None) -> Iterator[Identity]:
        """An identity for one trial process, held until the block ends. A range hands out a uid no
        other trial on this node holds (a lock file per uid, so several Ray worker processes agree);
        raises ConfinementError when all are taken or this process may not change users."""
        if os.geteuid() != 0:
            raise ConfinementError("--run-as needs the worker (and its Ray nodes) to run as root")
        if self.name is not None:
            assert self.gid is not None and self.home is not None
            yield Identity(self.first, self.gid, self.name, self.home)
            return
        directory = lock_dir or _lock_dir()
        for uid in range(self.first, self.last + 1):
            handle = os.open(directory / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue
            quarantine = False
            try:
                yield Identity(uid, uid, f"hpo-trial-{uid}", "/nonexistent")
            except ContainmentFailed:
                quarantine = True
                raise
            finally:
                if quarantine:
                    _QUARANTINED.append(handle)
                else:
                    os.close(handle)  # closing the descriptor releases the lock
            return
        raise ConfinementError(f"--run-as {self}: every uid is in use by a running trial on this node")


def _lock_dir() -> Path:
    """A folder only root may enter, for the uid locks of this node."""
    path = Path(tempfile.gettempdir()) / "hpo-run-as"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise ConfinementError(f"{path} must be a folder owned by root with mode 0700")
    return path


# -- every process of the attempt ---------------------------------------------------------------


def children_of(parent: int) -> list[int]:
    """Direct children of `parent`, from /proc (the 4th field of /proc/<pid>/stat)."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def descendants(root: int, spare: Iterable[int] = ()) -> list[int]:
    """Every process below `root` in the process tree, leaving out `spare` and everything below it."""
    spared = set(spare)
    found, frontier = [], [root]
    while frontier:
        level = [child for pid in frontier for child in children_of(pid) if child not in spared]
        found.extend(level)
        frontier = level
    return found


def kill_descendants(root: int | None = None, spare: Iterable[int] = (), rounds: int = 50) -> int:
    """Stops then kills every descendant of `root` (default: this process) except the subtrees of
    `spare` (processes that were there before the trial started), until none is left, and reaps the
    ones re-parented here. Stopping first keeps a forking process from adding children between the
    scan and the kill. Answers how many were killed."""
    root = os.getpid() if root is None else root
    spared, killed = set(spare), set()
    for _ in range(rounds):
        alive = [pid for pid in descendants(root, spared) if pid not in killed or _exists(pid)]
        if not alive:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        killed.update(alive)
        _reap(root, spared)
        time.sleep(0.01)
    _reap(root, spared)
    return len(killed)


def _exists(pid: int) -> bool:
    """Alive and not a zombie (a killed child that waits to be reaped by a parent we do not own)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] != b"Z"


def reap_children(spare: Iterable[int] = ()) -> None:
    """Collects this process's dead children but `spare` (orphans of an ended attempt,
    re-parented to this subreaper)."""
    _reap(os.getpid(), set(spare))


def _reap(root: int, spared: set[int]) -> None:
    """Collects this process's dead children (orphans re-parented to the subreaper), never the
    status of a spared one (a `subprocess.Popen` still to be waited for)."""
    if root != os.getpid():
        return
    for pid in children_of(root):
        if pid in spared:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
