"""Process lifetime and exposure, through Linux's prctl (no-ops elsewhere). Standard library only.

- Child processes that end with their parent: a server process of `hpo server --workers N`, a
  bayesian fitting process, a trial's process. Without this, a parent killed by SIGKILL leaves them
  running as orphans (holding a port, or 400 MB of torch each).
- A trial supervisor that reaps orphans (`become_subreaper`) and processes whose memory and
  environment other processes of the same user cannot read (`make_undumpable`)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value) on Linux; False where it is not available or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Asks the kernel to send `sig` to this process when the thread that started it ends. With
    `parent`, exits at once if that process is already gone (it died before the call)."""
    if not _prctl(_PR_SET_PDEATHSIG, sig):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def become_subreaper() -> bool:
    """Makes this process the reaper of its orphaned descendants: a process that `setsid`s and
    double-forks away from a trial is re-parented here instead of to init, so the trial's supervisor
    can still find and kill it (Linux 3.4+). Answers whether it took effect."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def make_undumpable() -> bool:
    """Marks this process not dumpable: its /proc/<pid>/environ, mem, maps and fds become readable
    by root only, so a trial running as the same user cannot read the secrets this process holds
    (and no core dump carries them). Reset by execve. Answers whether it took effect."""
    return _prctl(_PR_SET_DUMPABLE, 0)
