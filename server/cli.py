"""`hpo server`: registers the subcommand; uvicorn and the app load only when it runs."""

from __future__ import annotations

import argparse
import ipaddress
import os
from typing import Any

# The master's pid, for the worker processes of `--workers N` (see hpo.server.asgi).
MASTER_PID_VARIABLE = "HPO_SERVER_MASTER_PID"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "server", help="run the study service (HPO_DATABASE_URL, default SQLite in ./hpo.db)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="server processes (safe: leases live in the database)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="listen on a non-loopback address even though no token exists (anyone who reaches it can run "
        "trials on the workers)",
    )
    parser.add_argument(
        "--limit-concurrency", type=int, default=2000, help="connections and tasks at once before answering 503"
    )
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
    tokens = _upgrade_once(settings)
    if not is_loopback(args.host) and not settings.api_token and tokens == 0 and not args.insecure:
        raise CliError(
            f"refusing to listen on {args.host} with no token configured: create one first "
            "(hpo token create --role admin) or set HPO_API_TOKEN, or pass --insecure"
        )
    os.environ[MASTER_PID_VARIABLE] = str(os.getpid())
    uvicorn.run(
        "hpo.server.asgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        factory=False,
        # Idle keep-alive connections close after 5 s; request headers must arrive within 10 s
        # (hpo.server.http_protocol) and stay under 64 KiB; the body must arrive within 30 s
        # (hpo.server.api.hostile).
        timeout_keep_alive=5,
        http="hpo.server.http_protocol:HeaderDeadlineProtocol",
        h11_max_incomplete_event_size=64 * 1024,
        limit_concurrency=args.limit_concurrency,
        timeout_graceful_shutdown=30,
    )
    return 0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _upgrade_once(settings: Any) -> int:
    """Upgrades the schema once before the processes start; answers how many tokens exist."""
    from hpo.server.auth import token_count
    from hpo.server.db import Database

    db = Database(settings.database_url)
    try:
        db.upgrade()
        return token_count(db)
    finally:
        db.dispose()
