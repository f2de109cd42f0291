"""A full disk under the SQLite database is a 503 that says so ("database disk is full"), not the
driver's class name: SQLite's own page cap (`PRAGMA max_page_count`) fills the database as a full
disk would (SQLITE_FULL), without filling one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, event, text

from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer

SPEC = {
    "objective": {"metric": "valid/loss", "mode": "min"},
    "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0}],
}


@contextmanager
def capped(path: Path, pages: int) -> Iterator[None]:
    """Every new connection to the SQLite file at `path` may grow it to `pages` pages at most."""

    def cap(dbapi_connection: Any, _record: Any) -> None:
        files = [row[2] for row in dbapi_connection.execute("PRAGMA database_list")]
        if str(path) in files:
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(Engine, "connect", cap)
    try:
        yield
    finally:
        event.remove(Engine, "connect", cap)


def test_a_full_sqlite_database_is_a_503_database_disk_is_full(tmp_path: Path) -> None:
    path = tmp_path / "hpo.db"
    url = f"sqlite:///{path}"
    db = Database(url)
    db.upgrade()
    with db.engine.connect() as connection:
        pages = int(connection.execute(text("PRAGMA page_count")).scalar_one())
    db.dispose()
    settings = Settings(database_url=url, artifact_root=tmp_path / "artifacts", lease_seconds=60)
    with capped(path, pages + 40), LiveServer(settings) as server, httpx.Client(base_url=server.url) as client:
        small = client.post("/api/v1/studies", json={**SPEC, "name": "small", "num_trials": 2}, timeout=30)
        assert small.status_code == 201, small.text
        big = client.post("/api/v1/studies", json={**SPEC, "name": "big", "num_trials": 5_000}, timeout=30)
        assert big.status_code == 503, big.text
        assert big.json()["detail"] == "database disk is full"
        # Reads go on, and nothing of the refused study was kept.
        listed = client.get("/api/v1/studies", timeout=30)
        assert listed.status_code == 200
        assert [study["name"] for study in listed.json()["items"]] == ["small"]
