"""The ASGI entry point for uvicorn and other servers: `uvicorn hpo.server.asgi:app`."""

from __future__ import annotations

import os
import signal
import sys

from hpo.settings import Settings

from .app import create_app


def _die_with_master() -> None:
    """In a worker process of `hpo server --workers N`: end when the master ends, even by SIGKILL,
    instead of serving on as an orphan that holds the port (Linux: PR_SET_PDEATHSIG)."""
    master = os.environ.get("HPO_SERVER_MASTER_PID")
    if not master or int(master) == os.getpid() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(master):  # the master died before the call above
        os._exit(1)


_die_with_master()
app = create_app(Settings.from_env())
