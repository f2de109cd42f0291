"""`hpo server`: registers the subcommand; uvicorn and the app load only when it runs."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "server", help="run the study service (HPO_DATABASE_URL, default SQLite in ./hpo.db)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="server processes (safe: leases live in the database)")
    parser.add_argument("--log-level", default="info")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hpo.cli import CliError
    from hpo.settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    _upgrade_once(settings)
    uvicorn.run(
        "hpo.server.asgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        factory=False,
    )
    return 0


def _upgrade_once(settings: Any) -> None:
    from hpo.server.db import Database

    db = Database(settings.database_url)
    try:
        db.upgrade()
    finally:
        db.dispose()
