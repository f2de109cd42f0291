"""Child processes that end with their parent: a server process of `hpo server --workers N`, a
bayesian fitting process, a trial's command. Without this, a parent killed by SIGKILL leaves them
running as orphans (holding a port, or 400 MB of torch each). Linux only (PR_SET_PDEATHSIG);
elsewhere a no-op. Standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Asks the kernel to send `sig` to this process when the thread that started it ends. With
    `parent`, exits at once if that process is already gone (it died before the call)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)
