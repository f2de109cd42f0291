"""Whether this worker can write its artifact root (docs/workers.md, "Worker health").

A worker on a full or read-only disk would claim trial after trial and fail each within seconds,
every failure costing the trial an attempt. Before it claims, the worker checks its artifact root:
free space above a floor, and a real write (a small file written, synced and removed: a read-only
mount, a lost NFS export or an exhausted quota shows only when written to). The answer is one line
naming the folder and its free space, or None when the disk is fine."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_MIN_FREE_BYTES = 1 << 30  # 1 GiB: less would not hold a checkpoint of most models
_PROBE_BYTES = 64 * 1024
# The errors that are the disk's, not the trial's.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO})
_DISK_WORDS = ("No space left on device", "Read-only file system", "Disk quota exceeded", "database or disk is full")


def free_bytes(root: Path) -> int | None:
    """Free space for unprivileged writers on the file system of `root` (its nearest existing parent)."""
    folder = root
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        info = os.statvfs(folder)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def describe_free(root: Path) -> str:
    free = free_bytes(root)
    return "free space unknown" if free is None else f"{free / 2**20:,.0f} MiB free"


def artifact_root_problem(root: Path, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES) -> str | None:
    """Why trials cannot be written under `root` now, in one line; None when they can."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".hpo-write-probe-{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return f"cannot write the artifact root {root} ({exc.strerror or exc}; {describe_free(root)})"
    free = free_bytes(root)
    if free is not None and free < min_free_bytes:
        return (
            f"the artifact root {root} is nearly full ({describe_free(root)}, "
            f"below the {min_free_bytes / 2**20:,.0f} MiB this worker needs to claim)"
        )
    return None


def names_the_disk(text: str) -> bool:
    """Whether a failure reason says the disk was full or read-only."""
    return any(words in text for words in _DISK_WORDS)


class DiskHealth:
    """The worker's view of its artifact root, re-checked at most every `interval` seconds (a
    claim may come every tick), and at once when asked (after a failed trial). `changed` is called
    with the new problem (None: healthy again) on every change, and every `repeat` seconds while a
    problem lasts, so the server's record of the worker stays fresh."""

    def __init__(
        self,
        root: Path,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        changed: Callable[[str | None], None] | None = None,
        interval: float = 10.0,
        repeat: float = 60.0,
    ) -> None:
        self.root, self.min_free_bytes, self.changed = root, min_free_bytes, changed
        self.interval, self.repeat = interval, repeat
        self.problem: str | None = None
        self._checked = float("-inf")
        self._told: float | None = None

    def check(self, force: bool = False) -> str | None:
        now = time.monotonic()
        if not force and now - self._checked < self.interval:
            return self.problem
        self._checked = now
        problem = artifact_root_problem(self.root, self.min_free_bytes)
        due = self._told is None or problem != self.problem or (problem is not None and now - self._told > self.repeat)
        self.problem = problem
        if due and self.changed is not None:
            self._told = now
            self.changed(problem)
        return problem
