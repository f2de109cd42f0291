"""Models and migrations never drift; the upgrade is idempotent and safe from several servers."""

from __future__ import annotations

import threading

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from hpo.server.db import Database
from hpo.server.models import Base


def test_models_and_migrations_do_not_drift(database_url: str) -> None:
    db = Database(database_url)
    db.upgrade()
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    db.dispose()


def test_concurrent_upgrades_apply_once(database_url: str) -> None:
    errors: list[BaseException] = []

    def upgrade() -> None:
        db = Database(database_url)
        try:
            db.upgrade()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            db.dispose()

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
