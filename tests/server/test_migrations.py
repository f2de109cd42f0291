"""Models and migrations never drift; the upgrade is idempotent and safe from several servers."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from hpo.server.db import Database, alembic_config
from hpo.server.models import Base, MetricPoint


def _not_chunked(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """On Postgres `metric_points` is a view over `metric_chunks` (migration 0014), which the
    drift check does not read; `test_points_are_chunked_on_postgres` checks them instead."""
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table not in ("metric_points", "metric_chunks")


def test_models_and_migrations_do_not_drift(database_url: str) -> None:
    db = Database(database_url)
    db.upgrade()
    with db.engine.connect() as connection:
        opts = {"compare_type": True, "include_object": None if db.is_sqlite else _not_chunked}
        context = MigrationContext.configure(connection, opts=opts)
        assert compare_metadata(context, Base.metadata) == []
    db.dispose()


@pytest.mark.postgres
def test_points_are_chunked_on_postgres(postgres_url: str) -> None:
    """`metric_points` reads as the model's columns, from a view over one row per batch and metric."""
    db = Database(postgres_url)
    db.upgrade()
    with db.engine.connect() as connection:
        kinds = dict(
            connection.execute(
                text("SELECT relname, relkind FROM pg_class WHERE relname IN ('metric_points', 'metric_chunks')")
            ).all()
        )
        assert kinds == {"metric_points": "v", "metric_chunks": "r"}
        columns = connection.execute(
            text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'metric_points' ORDER BY ordinal_position"
            )
        ).all()
    model = [(c.name, c.type.compile(db.engine.dialect).lower()) for c in MetricPoint.__table__.columns]
    assert [name for name, _ in columns] == [name for name, _ in model]
    assert [t for _, t in columns] == ["integer", "character varying", "integer", "double precision", "smallint"]
    db.dispose()


def test_the_chunk_migration_moves_every_point_and_back(postgres_url: str) -> None:
    db = Database(postgres_url)
    db.upgrade()
    points = [(1, "a", 3, 0.5, 0), (1, "a", 1, None, 1), (1, "b", 7, 2.0, 0), (2, "a", 5, 1.5, 0)]
    with db.engine.begin() as connection:
        connection.execute(text("INSERT INTO metric_chunks VALUES (1, 'a', 1, 3, '{1,3}', '{NULL,0.5}', '{1,0}')"))
        connection.execute(text("INSERT INTO metric_chunks VALUES (1, 'b', 7, 7, '{7}', '{2.0}', '{0}')"))
        connection.execute(text("INSERT INTO metric_chunks VALUES (2, 'a', 5, 5, '{5}', '{1.5}', '{0}')"))
    read = "SELECT trial_id, name, step, value, nonfinite FROM metric_points ORDER BY trial_id, name, step"
    with db.engine.connect() as connection:
        assert sorted(connection.execute(text(read)).all()) == sorted(points)
    with db.engine.connect() as connection:
        config = alembic_config(db.url)
        config.attributes["connection"] = connection
        command.downgrade(config, "0013")
        connection.commit()
    with db.engine.connect() as connection:
        assert sorted(connection.execute(text(read)).all()) == sorted(points)
    db.upgrade()
    with db.engine.connect() as connection:
        assert sorted(connection.execute(text(read)).all()) == sorted(points)
        chunks = connection.execute(text("SELECT trial_id, name, first_step, last_step FROM metric_chunks")).all()
    assert sorted(chunks) == [(1, "a", 1, 3), (1, "b", 7, 7), (2, "a", 5, 5)]
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
