"""The claim and the heartbeat on psycopg's async connections, for the direct path of the worker
protocol (`hpo.server.api.hotpath`), Postgres only.

Through FastAPI a claim cost a server process 1.2 ms of CPU, most of it outside the statement: the
thread hop of a sync endpoint, SQLAlchemy's execution, routing and dependency injection. Here the
same statements (`leases.claim_statement`, `leases.heartbeat_statement`, compiled once to the
driver's SQL) run on the event loop, one round trip each, with the same answers. Whatever is
rare goes on through `leases` in a thread: the reaping of expired leases (once a second), a later
attempt's history cut, a worker handing back a trial it may not run.

Keep `claim` in step with `leases._claim_postgres`: anything added there at claim time must be
added here too (tests/api/test_hotpath.py compares the two)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.engine import make_url
from starlette.concurrency import run_in_threadpool

from hpo.server.db import IDLE_CHECK_SECONDS, Database
from hpo.server.errors import Conflict, HpoError, StorageError
from hpo.server.models import StudyStatus, Trial, TrialStatus
from hpo.server.schemas import Claim, HeartbeatAnswer
from hpo.server.trials import leases

_DIALECT = psycopg_dialect.dialect()
# Connections per server process: a claim or heartbeat holds one for a round trip, so a few keep
# a process's event loop busy; with the SQLAlchemy pool's (up to 40: db.POOL_KEPT + POOL_OVERFLOW)
# two processes fit in Postgres' default max_connections of 100 (`hpo server` warns when they do
# not: server.cli.connections_warning; docs/workers.md).
POOL_SIZE = 8


class Compiled:
    """A SQLAlchemy statement as the driver's SQL (`%(name)s` placeholders) with its constant
    parameters already bound and processed (enums to their stored strings); `params(**values)`
    adds the per-call ones."""

    def __init__(self, statement: Any, runtime: tuple[str, ...]) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        self.sql: str = compiled.string
        constants = compiled.construct_params({name: None for name in runtime})
        self.constants: dict[str, Any] = {}
        for key, value in constants.items():
            if key in runtime:
                continue
            processor = compiled.binds[key].type.bind_processor(_DIALECT)
            self.constants[key] = processor(value) if processor is not None else value

    def params(self, values: dict[str, Any]) -> dict[str, Any]:
        return {**self.constants, **values}


_CLAIM = Compiled(leases.claim_statement(False), ("lease_id", "worker_id", "cpus", "gpus", "lease_seconds"))
_HEARTBEAT = Compiled(leases.heartbeat_statement(), ("id", "lease_id", "s"))
_RUNNING, _ACTIVE = TrialStatus.running.value, StudyStatus.active.value


class AsyncDatabase:
    """A small pool of autocommit connections to the `Database`'s Postgres, opened on the event
    loop that serves requests (`open()` in the app's lifespan)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        url = make_url(db.url).set(drivername="postgresql")
        self._pool = AsyncConnectionPool(
            url.render_as_string(hide_password=False),
            min_size=2,
            max_size=POOL_SIZE,
            open=False,
            timeout=10.0,
            kwargs={"autocommit": True, "row_factory": namedtuple_row},
            check=_check_idle,
            reset=_mark_idle,
        )
        self.loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> None:
        await self._pool.open(wait=False)
        self.loop = asyncio.get_running_loop()

    async def close(self) -> None:
        self.loop = None
        await self._pool.close()

    def ready(self) -> bool:
        """Open, on the loop that is running now (a test client may run requests elsewhere)."""
        if self.loop is None:
            return False
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection in autocommit; driver errors become the service's (`Database.statement`)."""
        try:
            async with self._pool.connection() as connection:
                yield connection
        except HpoError:
            raise
        except psycopg.IntegrityError as error:
            raise Conflict(f"conflicting write: {error}") from error
        except psycopg.Error as error:
            raise StorageError(f"database error: {type(error).__name__}") from error
        except PoolTimeout as error:
            raise StorageError("database error: no connection within the pool's timeout") from error

    async def fetch_one(self, compiled: Compiled, values: dict[str, Any]) -> Any:
        async with self.connection() as connection:
            cursor = await connection.execute(compiled.sql, compiled.params(values))
            return await cursor.fetchone()


async def _check_idle(connection: psycopg.AsyncConnection[Any]) -> None:
    """Pings a connection that sat idle for `IDLE_CHECK_SECONDS` (Postgres may have restarted),
    as the SQLAlchemy pool does (`db._check_idle_connections`); a busy one is used as it is."""
    if time.monotonic() - getattr(connection, "_hpo_idle_since", 0.0) >= IDLE_CHECK_SECONDS:
        await connection.execute("SELECT 1")


async def _mark_idle(connection: psycopg.AsyncConnection[Any]) -> None:
    connection._hpo_idle_since = time.monotonic()  # type: ignore[attr-defined]


async def claim(adb: AsyncDatabase, worker_id: str, cpus: float, gpus: float, lease_seconds: float) -> Claim | None:
    """`leases.claim` for a claim without skipped studies, on Postgres: the same statement, the
    same reaping and the same history cut of a later attempt."""
    db = adb.db
    db.lease_seconds = lease_seconds  # the reaper's grace after an outage (`leases._reap`)
    lease_id = str(uuid.uuid4())
    values: dict[str, Any] = {
        "lease_id": lease_id,
        "worker_id": worker_id,
        "cpus": cpus,
        "gpus": gpus,
        "lease_seconds": lease_seconds,
    }
    reaped_first = db.reap_due()
    if reaped_first:
        await run_in_threadpool(leases.reap_expired, db)
    row = await adb.fetch_one(_CLAIM, values)
    if row is None and not reaped_first and await run_in_threadpool(leases.reap_expired, db) > 0:
        row = await adb.fetch_one(_CLAIM, values)
    if row is None:
        return None
    resume = None
    if row.attempt > 1:
        cut, resume = await run_in_threadpool(_cut_history, db, row, lease_id)
        if not cut:
            return None
    return leases.claim_answer(row, lease_seconds, resume)


def _cut_history(db: Database, row: Any, lease_id: str) -> tuple[bool, Any]:
    """A later attempt's history cut, in its own transaction under the new lease (as in
    `leases._claim_postgres`); (False, None) when that lease expired already."""
    with db.transaction() as session:
        current = session.scalar(select(Trial.lease_id).where(Trial.id == row.id).with_for_update())
        if current != lease_id:
            return False, None
        resume = leases.resume_point(session, row.id, row.restart_after_attempt, row.attempt)
        leases.truncate_history(session, row.id, row.objective_metric, row.objective_mode, resume)
        return True, resume


async def heartbeat(adb: AsyncDatabase, trial_id: int, lease_id: str, lease_seconds: float) -> HeartbeatAnswer | None:
    """`leases.heartbeat`'s renewal; None when it renewed nothing (then `leases.heartbeat` says why)."""
    adb.db.lease_seconds = lease_seconds
    renewed = await adb.fetch_one(_HEARTBEAT, {"id": trial_id, "lease_id": lease_id, "s": lease_seconds})
    if renewed is None:
        return None
    stop = renewed.status != _RUNNING or renewed.study_status != _ACTIVE
    return HeartbeatAnswer(lease_expires_at=float(renewed.lease_expires_at), should_stop=stop)
