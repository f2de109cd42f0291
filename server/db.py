"""Engine, transactions and schema upgrades: the one place that talks to the driver directly.

Every unit of work goes through `Database.transaction()`, which commits, or rolls back and turns
driver errors into the service's own `StorageError` (Optuna's storage does the same)."""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from importlib import resources
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Double, Engine, create_engine, event, exc, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.expression import ColumnElement, FunctionElement, literal_column

from hpo.server.errors import Conflict, HpoError, StorageError

# An arbitrary constant shared by every hpo server: the advisory lock that serializes upgrades.
_MIGRATION_LOCK_KEY = 0x68706F
# A pooled connection idle for longer than this is checked (one round trip) before it is used; a
# busy one is not: pinging before every request was a fifth of a claim's round trips.
IDLE_CHECK_SECONDS = 5.0
_log = logging.getLogger("hpo.server")
# The kept rows serve the analysis, whose logger has always reported a failed keep.
_kept_log = logging.getLogger("hpo.server.analysis")


class Database:
    """One database: an engine, a session factory and the dialect-specific clock."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.engine = _make_engine(url, echo=echo)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._next_reap = 0.0
        # When this process's reaper last reached the database (monotonic), and the lease its
        # workers are given (the claims and heartbeats say it): after a longer silence the reaper
        # first gives every running lease a lease period from now (docs/workers.md, "Database
        # outages"), so workers whose heartbeats failed meanwhile are not reaped for it.
        self._reached_at = time.monotonic()
        self.lease_seconds = 60.0
        # The driver's own errors, raised past SQLAlchemy by code that uses the driver's
        # connection directly (COPY, binary cursors).
        self._driver_errors: tuple[type[BaseException], ...] = (self.engine.dialect.loaded_dbapi.Error,)
        # What maps to a 503: SQLAlchemy's errors and the driver's own (raw COPY, binary cursors).
        self._storage_errors: tuple[type[BaseException], ...] = (SQLAlchemyError, *self._driver_errors)

    def warm_pool(self, connections: int) -> None:
        """Opens `connections` pooled connections now (Postgres), so a burst of first requests,
        such as every worker of a fleet claiming at once after a restart, does not wait for them."""
        if self.is_sqlite:
            return
        opened = []
        try:
            for _ in range(connections):
                opened.append(self.engine.connect())
        except SQLAlchemyError:
            _log.warning("could not open the database connections ahead", exc_info=True)
        finally:
            for connection in opened:
                connection.close()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error. Driver
        errors (SQLAlchemy's, and the driver's own from code that uses its connection directly)
        become `StorageError`; the service's own errors pass through unchanged. The rollback and
        the close are guarded: on a connection that died they fail too, and that second error
        must not replace the first (docs/workers.md, "Database outages")."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except HpoError:
            discard(session)
            raise
        except IntegrityError as exc:
            # Two writers raced past the same check (e.g. one study name): the loser gets a 409.
            discard(session)
            raise Conflict(f"conflicting write: {exc.orig}") from exc
        except self._storage_errors as exc:
            discard(session)
            raise storage_error(exc) from exc
        except BaseException:
            discard(session)
            raise
        finally:
            close_quietly(session)

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        """A connection in autocommit, for the hot paths that are one statement (each statement
        its own transaction): no BEGIN and COMMIT round trips. Errors are mapped as in
        `transaction()`. Postgres only; on SQLite use `transaction()` (BEGIN IMMEDIATE)."""
        try:
            connection = self._autocommit.connect()
        except self._storage_errors as error:
            raise storage_error(error) from error
        try:
            yield connection
        except HpoError:
            raise
        except IntegrityError as error:
            raise Conflict(f"conflicting write: {error.orig}") from error
        except self._storage_errors as error:
            raise storage_error(error) from error
        finally:
            close_quietly(connection)

    def now_seconds(self) -> ColumnElement[float]:
        """The database clock in seconds since the epoch, as an SQL expression. Leases compare
        against it, so server processes and workers never need agreeing clocks."""
        return self.clock(self.is_sqlite)

    @staticmethod
    def clock(sqlite: bool) -> ColumnElement[float]:
        if sqlite:
            return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
        # statement_timestamp() rather than clock_timestamp(): stable within a statement, so the
        # reaper's `lease_expires_at < now` can be an index condition.
        return literal_column("extract(epoch from statement_timestamp())::double precision")

    def reap_due(self, interval: float = 1.0) -> bool:
        """True at most once per `interval` seconds in this process: claims reap expired leases
        that often, not at every call (a race here only reaps twice, which is harmless)."""
        now = time.monotonic()
        if now < self._next_reap:
            return False
        self._next_reap = now + interval
        return True

    def unreached_for(self) -> float:
        """Seconds since this process's reaper last reached the database."""
        return time.monotonic() - self._reached_at

    def reached(self) -> None:
        self._reached_at = time.monotonic()

    def upgrade(self) -> None:
        """Brings the schema to the newest migration, exactly once however many servers start at
        once: under an advisory lock on Postgres, a file lock beside the SQLite file."""
        with self._upgrade_lock(), self.engine.connect() as connection:
            config = alembic_config(self.url)
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()

    @contextmanager
    def _upgrade_lock(self) -> Iterator[None]:
        if self.is_sqlite:
            path = self.engine.url.database
            if not path or path == ":memory:":
                yield
                return
            with open(f"{path}.migrate-lock", "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        with self.engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK_KEY})
                connection.commit()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return True
        except SQLAlchemyError:
            return False

    def dispose(self) -> None:
        self.engine.dispose()


def storage_error(exc: BaseException) -> StorageError:
    """A driver error as the service's 503: a full disk by name (SQLite's SQLITE_FULL, Postgres'
    disk_full), anything else by the driver's error class (the details go to the log)."""
    orig = (exc.orig or exc) if isinstance(exc, DBAPIError) else exc
    if _disk_full(orig):
        return StorageError("database disk is full")
    return StorageError(f"database error: {type(orig).__name__}")


def _disk_full(error: BaseException) -> bool:
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "database or disk is full" in str(error)
    return getattr(error, "sqlstate", None) == "53100"  # Postgres' disk_full


def discard(session: Session) -> None:
    """Rolls `session` back; where that fails too (its connection died), invalidates its
    connections instead, so the pool never hands them out again. Never raises: the caller is
    already reporting the error that brought it here."""
    try:
        session.rollback()
    except Exception:  # the connection is gone: the rollback's error says nothing new
        with suppress(Exception):
            session.invalidate()


def close_quietly(resource: Session | Connection) -> None:
    """Closes a session or connection, invalidating it where closing fails (a dead connection's
    reset on return to the pool); never raises."""
    try:
        resource.close()
    except Exception:  # the connection is gone: drop it rather than return it to the pool
        with suppress(Exception):
            resource.invalidate()


class epoch_seconds(FunctionElement[float]):  # noqa: N801 (used as a SQL function)
    """A timestamp column as seconds since the epoch (a float), computed by the database: reading
    thousands of rows, building a timezone-aware `datetime` for each and converting it back cost
    more than the rest of the dashboard's timeline (NULL stays NULL)."""

    type = Double()
    inherit_cache = True


@compiles(epoch_seconds, "postgresql")
def _epoch_postgres(element: epoch_seconds, compiler: Any, **kw: Any) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)}) AS DOUBLE PRECISION)"


@compiles(epoch_seconds, "sqlite")
def _epoch_sqlite(element: epoch_seconds, compiler: Any, **kw: Any) -> str:
    # SQLAlchemy stores SQLite timestamps as UTC text; julianday reads it (to the millisecond).
    return f"((julianday({compiler.process(element.clauses, **kw)}) - 2440587.5) * 86400.0)"


def alembic_config(url: str) -> Config:
    """Alembic's configuration, built in code so migrations ship inside the wheel."""
    config = Config()
    config.set_main_option("script_location", str(resources.files("hpo.migrations")))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


# A server process's SQLAlchemy pool on Postgres: connections kept, and opened beyond them under
# load (the hot path's own pool is `aio.POOL_SIZE`; `hpo server` adds them up against the
# database's max_connections).
POOL_KEPT, POOL_OVERFLOW = 20, 20


def _make_engine(url: str, *, echo: bool) -> Engine:
    if not url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, pool_size=POOL_KEPT, max_overflow=POOL_OVERFLOW)
        _check_idle_connections(engine)
        return engine
    engine = create_engine(url, echo=echo, connect_args={"timeout": 30, "check_same_thread": False})
    _serialize_sqlite_writes(engine)
    return engine


def _check_idle_connections(engine: Engine) -> None:
    """SQLAlchemy's pessimistic disconnect handling (the pool's `checkout` recipe), for
    connections that sat idle for `IDLE_CHECK_SECONDS` only: a dead one (Postgres restarted) is
    replaced before use. A connection that dies while busy fails its request (503, which workers
    retry) and SQLAlchemy then invalidates the whole pool, so the next requests get fresh ones."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", 0.0) < IDLE_CHECK_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)  # in autocommit: opens no transaction
        except Exception as error:  # any driver error: this connection is unusable
            raise exc.DisconnectionError(str(error)) from error


def _serialize_sqlite_writes(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE on every transaction: writers queue for the write
    lock at the start instead of failing with "database is locked" when a read upgrades to a write
    (SQLAlchemy's documented recipe for pysqlite)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=30000")  # first: switching to WAL itself may wait
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def keep_rows(session: Session, table: type[Any], rows: Sequence[Mapping[str, Any]], what: str) -> bool:
    """Upserts kept per-trial rows (`curve_stats`, `curve_sketches`: keyed by trial and name) in a
    savepoint; False, with a warning naming `what`, when the write failed (a lost race, a
    read-only database), which costs only the keeping."""
    if not rows:
        return True
    upsert: Any = pg_insert if on_postgres(session) else sqlite_insert
    statement = upsert(table)
    statement = statement.on_conflict_do_update(
        index_elements=["trial_id", "name"],
        set_={c: statement.excluded[c] for c in rows[0] if c not in ("trial_id", "name")},
    )
    try:
        with session.begin_nested():
            # A Core statement on the connection: the driver's executemany (pipelined by psycopg).
            # Through the ORM's bulk path the same list ran as one statement per row, 7 of the 11 s
            # of a 5,000-trial study's first analysis on a loaded machine.
            connection = session.connection()
            for start in range(0, len(rows), 2000):
                connection.execute(statement, list(rows[start : start + 2000]))
    except SQLAlchemyError:
        _kept_log.warning("could not keep the %s", what, exc_info=True)
        return False
    return True


def on_postgres(session: Session) -> bool:
    """Whether `session` speaks to Postgres (where points are chunks: migration 0014)."""
    return session.get_bind().dialect.name == "postgresql"
