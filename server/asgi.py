"""The ASGI entry point for uvicorn and other servers: `uvicorn hpo.server.asgi:app`."""

from __future__ import annotations

import os
import signal

from hpo.lifetime import die_with_parent
from hpo.server.api.guards import protocol
from hpo.server.app import create_app
from hpo.server.config import ServerSettings
from hpo.settings import Settings


def _die_with_master() -> None:
    """In a worker process of `hpo server --workers N`: end when the master ends, even by SIGKILL,
    instead of serving on as an orphan that holds the port."""
    master = os.environ.get("HPO_SERVER_MASTER_PID")
    if master and int(master) != os.getpid():
        die_with_parent(signal.SIGTERM, parent=int(master))


_die_with_master()
_server = ServerSettings.from_env()
protocol.configure(_server.header_seconds, _server.body_seconds)
app = create_app(Settings.from_env(), server=_server)
