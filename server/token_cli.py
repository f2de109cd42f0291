"""`hpo token create|list|revoke`: manages API tokens in the database directly (HPO_DATABASE_URL),
as the operator who runs the server does; no token is needed to create the first one, and no
HTTP route can mint tokens, so a stolen admin token cannot make itself permanent unnoticed.

As `hpo server`, it imports SQLAlchemy and the database modules only inside the handlers that
need them, so `hpo --help` loads neither."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from hpo.cli import CliError
from hpo.server.errors import HpoError
from hpo.settings import Settings, SettingsError

ROLES = ("read", "write", "worker", "admin")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "token",
        help="create, list and revoke API tokens (in the database at HPO_DATABASE_URL)",
        description="Tokens have a role: read (every GET), write (also create and change studies, trials), "
        "worker (claim and the lease-fenced trial writes only), admin (everything). Once any token exists, "
        "every call but /healthz and /readyz needs one.",
    )
    commands = parser.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = commands.add_parser("create", help="create a token and print it once (stdout)")
    create.add_argument(
        "--role",
        required=True,
        choices=ROLES,
        help="read: every GET; write: also create and change studies; worker: claim and trial writes; admin: all",
    )
    create.add_argument("--name", default="", help="what it is for (a person, a worker pool; default none)")
    create.add_argument(
        "--output",
        metavar="FILE",
        help="write the token to FILE (mode 0600) instead of stdout; when FILE already holds a token, "
        "create nothing (for deployment scripts that run at every start)",
    )
    create.set_defaults(handler=_create)
    listing = commands.add_parser("list", help="list tokens (never the tokens themselves)")
    listing.set_defaults(handler=_list)
    revoke = commands.add_parser("revoke", help="revoke a token by id (servers refuse it within 2 s)")
    revoke.add_argument("id", type=int, help="the token's id (hpo token list)")
    revoke.set_defaults(handler=_revoke)


def _database() -> Any:
    from hpo.server.db import Database  # lazy: SQLAlchemy stays out of hpo --help (module docstring)

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    db = Database(settings.database_url)
    db.upgrade()
    return db


def _create(args: argparse.Namespace) -> int:
    from hpo.server.auth.tokens import create_token  # lazy: SQLAlchemy stays out of hpo --help (module docstring)

    output = Path(args.output) if args.output else None
    if output is not None and output.is_file() and output.read_text().strip():
        print(f"{output} already holds a token; nothing created", file=sys.stderr)
        return 0
    db = _database()
    try:
        info, token = create_token(db, args.role, args.name)
    except HpoError as exc:
        raise CliError(exc.message) from None
    finally:
        db.dispose()
    label = f"{info.role}, {info.name}" if info.name else info.role
    if output is not None:
        _write_private(output, token + "\n")
        print(f"token {info.id} ({label}) written to {output}", file=sys.stderr)
        return 0
    print(f"token {info.id} ({label}); it is shown only now:", file=sys.stderr)
    print(token)
    return 0


def _write_private(path: Any, text: str) -> None:
    temporary = path.with_name(path.name + ".new")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _list(_args: argparse.Namespace) -> int:
    from hpo.server.auth.tokens import list_tokens  # lazy: SQLAlchemy stays out of hpo --help (module docstring)

    db = _database()
    try:
        tokens = list_tokens(db)
    finally:
        db.dispose()
    print(f"{'id':>4}  {'role':<7}{'status':<9}{'created':<26}name")
    for t in tokens:
        status = "active" if t.active else "revoked"
        print(f"{t.id:>4}  {t.role:<7}{status:<9}{t.created_at.isoformat(timespec='seconds'):<26}{t.name}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from hpo.server.auth.tokens import revoke_token  # lazy: SQLAlchemy stays out of hpo --help (module docstring)

    db = _database()
    try:
        info = revoke_token(db, args.id)
    except HpoError as exc:
        raise CliError(exc.message) from None
    finally:
        db.dispose()
    print(f"token {info.id} ({info.role}) revoked")
    return 0
