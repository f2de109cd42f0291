"""Shared fixtures: one suite runs on SQLite and on the real Postgres, each test on a clean
database; HTTP tests talk to a real uvicorn server on a free port.

Postgres is at HPO_TEST_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432). On a
laptop without it the Postgres half skips; with HPO_REQUIRE_POSTGRES=1 (set by .ci/run) it fails."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, text

from hpo.server.app import create_app
from hpo.server.config import ServerSettings
from hpo.server.db import Database
from hpo.settings import Settings

POSTGRES_URL = os.environ.get("HPO_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432")
REQUIRE_POSTGRES = os.environ.get("HPO_REQUIRE_POSTGRES") == "1"


def _admin_engine():  # type: ignore[no-untyped-def]
    return create_engine(f"{POSTGRES_URL}/postgres", isolation_level="AUTOCOMMIT", pool_pre_ping=True)


# Test databases are dropped in the background: a drop is a tenth of a second of checkpointing
# that no test needs to wait for (names are random, so nothing reuses one). The template's
# teardown waits for them all and fails on any that failed.
_DROPS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-test-database")
_DROPPING: list[Future[None]] = []


def _postgres_available() -> str | None:
    try:
        with _admin_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except Exception as exc:  # any failure to connect means "no Postgres here"
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A migrated template database; each test clones it (much faster than migrating)."""
    problem = _postgres_available()
    if problem is not None:
        message = f"Postgres not reachable at {POSTGRES_URL}: {problem}"
        if REQUIRE_POSTGRES:
            pytest.fail(message + " (HPO_REQUIRE_POSTGRES=1: a Postgres skip is a failure)")
        pytest.skip(message)
    name = f"hpo_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(f"{POSTGRES_URL}/{name}")
    db.upgrade()
    db.dispose()
    yield name
    for dropping in _DROPPING:
        dropping.result()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _clone_postgres(template: str) -> tuple[str, str]:
    name = f"hpo_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    admin.dispose()
    return name, f"{POSTGRES_URL}/{name}"


def _drop_postgres(name: str) -> None:
    _DROPPING.append(_DROPS.submit(_drop_now, name))


def _drop_now(name: str) -> None:
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A clean database URL, once for SQLite and once for Postgres."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hpo.db'}"
        return
    name, url = _clone_postgres(request.getfixturevalue("postgres_template"))
    yield url
    _drop_postgres(name)


# For the slow tests that run real trainers and workers: Postgres only, the production database.
# Each of them is a minute of processes starting whichever database answers; what differs between
# the databases (the one-statement claim and ingest, the kept statistics) the fast tests check on
# both, and the demo and the SQLite-only real runs keep the embedded default covered.
ON_POSTGRES_ONLY = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A clean Postgres database only (for tests that need row locks or real concurrency)."""
    name, url = _clone_postgres(request.getfixturevalue("postgres_template"))
    yield url
    _drop_postgres(name)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.upgrade()
    yield database
    database.dispose()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=database_url, artifact_root=tmp_path / "artifacts", lease_seconds=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """The real app under uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings, server: ServerSettings | None = None) -> None:
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(settings, server=server)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_server(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(settings) as server:
        yield server


@pytest.fixture
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield http


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The one local Ray instance of the test session (2 CPUs, no dashboard): every test that runs a
    real worker shares it (a second `ray.init` in one process fails)."""
    import ray

    repo = Path(__file__).resolve().parents[1]
    # Ray's worker processes inherit this, so they can import tests.worker.fake_trainer.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 1024**2)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
