"""`hpo server`: registers the subcommand; uvicorn, the app and SQLAlchemy load only when it runs
(imported inside the functions that need them), so `hpo --help` loads none of them."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.cli import CliError
from hpo.policy import COMMANDS_ENV, ENV_ENV, WORKLOADS_ENV, ExecutionPolicy, PolicyError
from hpo.server.auth import signing_key
from hpo.server.config import ServerSettings
from hpo.settings import Settings, SettingsError

if TYPE_CHECKING:
    from hpo.server.db import Database

# The master's pid, for the worker processes of `--workers N` (see hpo.server.asgi).
MASTER_PID_VARIABLE = "HPO_SERVER_MASTER_PID"
# HPO_API_TOKEN on an address others can reach: at least this long, and not a few characters
# repeated (tokens from `hpo token create` have 43 characters of 256 random bits).
MIN_TOKEN_LENGTH = 32
MIN_TOKEN_CHARACTERS = 8


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "server",
        help="run the study service (HPO_DATABASE_URL, default SQLite in ./hpo.db)",
        description="The study service: REST API under /api/v1, dashboard at /. Upgrades the database schema "
        "first. Settings come from HPO_* variables (docs/settings.md): HPO_DATABASE_URL (default "
        "sqlite:///./hpo.db), HPO_ARTIFACT_ROOT (./artifacts), HPO_API_TOKEN, HPO_LEASE_SECONDS (60).",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for every interface (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--workers", type=int, default=1, help="server processes (default 1; safe: leases live in the database)"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default info)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="listen on a non-loopback address even though no token exists (anyone who reaches it can run "
        "trials on the workers; default: refuse)",
    )
    parser.add_argument(
        "--limit-concurrency",
        type=int,
        default=2000,
        help="requests in progress at once, per server process, before answering 503; the health checks are "
        "always answered (default 2000)",
    )
    parser.add_argument(
        "--allow-workload",
        action="append",
        default=[],
        metavar="GLOB",
        help="accept studies whose user workload's module matches GLOB (repeatable; adds to $HPO_ALLOWED_WORKLOADS; "
        "default none). Give the workers the same: the server's list only refuses other studies early",
    )
    parser.add_argument(
        "--allow-command",
        action="append",
        default=[],
        metavar="PREFIX",
        help="accept studies whose trainer.command starts with PREFIX (shell-quoted, e.g. '{python} train.py'; "
        "repeatable; adds to $HPO_ALLOWED_COMMANDS; default none), as hpo worker --allow-command",
    )
    parser.add_argument(
        "--allow-env",
        action="append",
        default=[],
        metavar="GLOB",
        help="accept studies setting these trainer.env names (repeatable; adds to $HPO_ALLOWED_ENV; default: the "
        "short list in docs/security.md), as hpo worker --allow-env",
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # lazy: hpo --help must not load uvicorn (module docstring)

    try:
        _export_allow_lists(args)  # every server process reads its settings from the environment
        settings = Settings.from_env()
        server = ServerSettings.from_env()  # read again by each server process (hpo.server.asgi)
    except (SettingsError, PolicyError) as exc:
        raise CliError(str(exc)) from None
    if server.max_unauthenticated >= args.limit_concurrency:
        raise CliError(
            f"HPO_MAX_UNAUTHENTICATED ({server.max_unauthenticated}) must be below --limit-concurrency "
            f"({args.limit_concurrency}), or unauthenticated requests could take every slot"
        )
    if server.max_uploads_per_token >= args.limit_concurrency:
        raise CliError(
            f"HPO_MAX_UPLOADS_PER_TOKEN ({server.max_uploads_per_token}) must be below --limit-concurrency "
            f"({args.limit_concurrency}), or one token's slow uploads could take every slot"
        )
    _check_token_strength(args.host, settings.api_token)
    _check_port(args.host, args.port)
    _signing_key_once(settings, server)
    tokens = _upgrade_once(settings, args.workers)
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
        # Idle keep-alive connections close after 5 s; request headers must arrive within
        # HPO_HEADER_SECONDS and stay under 64 KiB, the whole body within HPO_BODY_SECONDS, and
        # --limit-concurrency counts requests in progress, health checks excepted
        # (hpo.server.api.guards.protocol, hpo.server.api.guards.body).
        timeout_keep_alive=5,
        http="hpo.server.api.guards.protocol:HeaderDeadlineProtocol",
        h11_max_incomplete_event_size=64 * 1024,
        limit_concurrency=args.limit_concurrency,
        timeout_graceful_shutdown=30,
    )
    return 0


def _export_allow_lists(args: argparse.Namespace) -> None:
    """`--allow-workload/--allow-command/--allow-env` added to the `HPO_ALLOWED_*` variables that
    every server process reads (one story with `hpo worker`'s options of the same names)."""
    if not (args.allow_workload or args.allow_command or args.allow_env):
        return
    policy = ExecutionPolicy.from_env().merged(args.allow_workload, args.allow_command, args.allow_env)
    os.environ[WORKLOADS_ENV] = ",".join(policy.workload_globs)
    os.environ[COMMANDS_ENV] = json.dumps([list(prefix) for prefix in policy.command_prefixes])
    os.environ[ENV_ENV] = ",".join(policy.env_globs)


def token_weakness(token: str) -> str | None:
    """Why `token` is too weak to guard a server that others can reach, or None."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"it has {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}"
    if len(set(token)) < MIN_TOKEN_CHARACTERS:
        return f"it repeats {len(set(token))} different characters"
    return None


def _check_token_strength(host: str, token: str | None) -> None:
    """A guessable HPO_API_TOKEN is an admin password for anyone who reaches a public address."""
    weakness = None if is_loopback(host) or not token else token_weakness(token)
    if weakness is not None:
        raise CliError(
            f"refusing to listen on {host} with a weak HPO_API_TOKEN ({weakness}): use at least {MIN_TOKEN_LENGTH} "
            "random characters (HPO_API_TOKEN=$(openssl rand -hex 32)), or tokens from `hpo token create`"
        )


def _check_port(host: str, port: int) -> None:
    """Refuses a taken port in one line, before the schema upgrade, instead of uvicorn's late error."""
    with socket.socket() as sock:
        # As uvicorn binds: a port whose last server just exited (TIME_WAIT) is free to take.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CliError(
                f"cannot listen on {host}:{port} ({exc.strerror}); another program (or hpo server) has it: "
                "choose another --port"
            ) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _signing_key_once(settings: Any, server: Any) -> None:
    """Creates the key file before the processes start (they all read it then), or says in one
    line why it cannot be."""
    try:
        signing_key.load(settings.session_secret, server.secret_file)
    except signing_key.SigningKeyError as exc:
        raise CliError(str(exc)) from None


def _upgrade_once(settings: Any, processes: int) -> int:
    """Upgrades the schema once before the processes start, and warns when they could need more
    Postgres connections than are free; answers how many tokens exist."""
    # lazy: SQLAlchemy and the database modules stay out of hpo --help (module docstring)
    from sqlalchemy.exc import SQLAlchemyError

    from hpo.server.auth.tokens import token_count
    from hpo.server.db import Database

    try:
        db = Database(settings.database_url)
        try:
            db.upgrade()
            warning = connections_warning(db, processes)
            if warning:
                print(f"hpo server: warning: {warning}", file=sys.stderr)
            return token_count(db)
        finally:
            db.dispose()
    except (OSError, SQLAlchemyError) as exc:
        raise CliError(database_problem(settings.database_url, exc)) from None


def connections_warning(db: Database, processes: int) -> str | None:
    """What to tell the operator when `processes` server processes, each with its full pools,
    would need more Postgres connections than the database has free (None on SQLite, or when they
    fit). Past max_connections, requests answer 503 under load (bench/fleet_sim.py: 4 processes
    and 1,000 workers on Postgres' default of 100)."""
    # lazy: SQLAlchemy and the database modules stay out of hpo --help (module docstring)
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from hpo.server.db import POOL_KEPT, POOL_OVERFLOW
    from hpo.server.trials.leases_async import POOL_SIZE

    if db.is_sqlite:
        return None
    per_process = POOL_KEPT + POOL_OVERFLOW + POOL_SIZE
    try:
        with db.engine.connect() as conn:
            limit, reserved, in_use = conn.execute(
                text(
                    "SELECT current_setting('max_connections')::int, "
                    "current_setting('superuser_reserved_connections')::int, "
                    "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid())"
                )
            ).one()
    except SQLAlchemyError:  # a role that may not read these: no warning rather than no server
        return None
    free = limit - reserved - in_use
    needed = processes * per_process
    if needed <= free:
        return None
    return (
        f"{processes} server process(es) may open up to {needed} Postgres connections ({per_process} each), "
        f"and the database has {free} free (max_connections {limit}, {in_use} in use, {reserved} reserved): "
        "under load, requests past that answer 503. Raise max_connections or put PgBouncer in front "
        "(docs/workers.md)"
    )


def database_problem(url: str, exc: BaseException) -> str:
    """One or two lines for a database the server cannot open: what failed and what to do."""
    from sqlalchemy.engine import make_url  # lazy: SQLAlchemy stays out of hpo --help (module docstring)

    try:
        parsed = make_url(url)
    except Exception:  # an unparsable URL: Settings.validate let it through, so say it plainly
        return f"HPO_DATABASE_URL {url!r} cannot be used: {exc}"
    shown = parsed.render_as_string(hide_password=True)
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if parsed.get_backend_name() == "sqlite":
        folder = _sqlite_folder(parsed.database)
        if folder is not None and not folder.is_dir():
            return (
                f"HPO_DATABASE_URL {shown}: the folder {folder} does not exist; create it "
                f"(mkdir -p {folder}) or point HPO_DATABASE_URL at an existing folder"
            )
        return f"cannot open the SQLite database {shown}: {text}"
    if "does not exist" in text and "database" in text:
        user = f" -U {parsed.username}" if parsed.username else ""
        host = parsed.host or "localhost"
        return (
            f"the Postgres database {parsed.database!r} does not exist on {host}; create it with "
            f"`createdb -h {host}{user} {parsed.database}`, or fix HPO_DATABASE_URL ({shown})"
        )
    return f"cannot connect to the database {shown}: {text}\ncheck that it runs and that HPO_DATABASE_URL is right"


def _sqlite_folder(database: str | None) -> Any:
    if not database or database == ":memory:":
        return None
    return Path(database).absolute().parent
