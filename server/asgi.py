"""The ASGI entry point for uvicorn and other servers: `uvicorn hpo.server.asgi:app`."""

from __future__ import annotations

from hpo.settings import Settings

from .app import create_app

app = create_app(Settings.from_env())
