"""Alembic environment: the server passes its open connection in `config.attributes`; the
`alembic` command line falls back to the URL in the config (from HPO_DATABASE_URL)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from hpo.server.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("HPO_DATABASE_URL", "sqlite:///./hpo.db")
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("hpo migrations run online only: the server applies them at start")
run_migrations_online()
