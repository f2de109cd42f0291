"""Assembles the FastAPI application: routers, error mapping, middleware and the lease reaper."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from hpo.server.analysis import importance
from hpo.server.analysis.keeper import Keeper
from hpo.server.api import errors, openapi
from hpo.server.api.guards.body import HostileInput
from hpo.server.api.guards.credentials import Auth
from hpo.server.api.guards.size import BodyLimit, PagePolicy
from hpo.server.api.hotpath import HotPath
from hpo.server.api.html_errors import HtmlErrors
from hpo.server.api.routes import analysis, charts, dashboard, health, pipelines, signin, studies, trials, workers
from hpo.server.auth import signing_key
from hpo.server.auth.tokens import Authenticator
from hpo.server.bayesian.queue import Refiller
from hpo.server.cache.kept import StillStudies
from hpo.server.config import ServerSettings
from hpo.server.dashboard.charts import service as chart_data
from hpo.server.db import Database
from hpo.server.errors import StorageError, one_line
from hpo.server.studies import service as studies_service
from hpo.server.trials import leases
from hpo.server.trials.leases_async import AsyncDatabase
from hpo.settings import Settings

_log = logging.getLogger("hpo.server")


WARM_CONNECTIONS = 8  # a fleet's first burst of claims, spread over the server's processes


def _warm_up(db: Database) -> None:
    db.warm_pool(WARM_CONNECTIONS)


def create_app(settings: Settings, *, upgrade: bool = True, server: ServerSettings | None = None) -> FastAPI:
    """The application over `settings.database_url`; the schema is upgraded on start. `server`
    defaults to the `HPO_*` environment's (`ServerSettings.from_env`)."""
    server = server if server is not None else ServerSettings.from_env()
    db = Database(settings.database_url)
    if upgrade:
        db.upgrade()
    # Claims and heartbeats on the event loop (api/hotpath.py); Postgres only.
    adb = None if db.is_sqlite else AsyncDatabase(db)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap_forever(db, settings.lease_seconds / 4))
        refiller = Refiller(db, processes=settings.bayesian_processes)  # bayesian proposal queues
        refiller.start()
        # Completed trials' curve statistics, then still studies' first-screen charts and analyses,
        # kept off the request path.
        keeper = Keeper(db, after_pass=StillStudies(db, chart_data.first_visit_answer))
        keeper.start()
        # The importance chart's scikit-learn (and the pandas it pulls in) take 0.5-1.7 s of CPU to
        # import: done before the server answers, so a study page's first visit neither waits for
        # it nor shares the interpreter with it (a thread importing meanwhile held the GIL for a
        # fifth of a loaded machine's first visit, docs/decisions.md).
        await run_in_threadpool(importance.preload)
        # What the imports left is never garbage: out of the collector's sight, a full collection
        # scans only what requests made (one over the ~300,000 startup objects took 150 ms of a
        # 5,000-trial study's timeline chart, its first call 229 ms instead of 75).
        gc.collect()
        gc.freeze()
        threading.Thread(target=_warm_up, args=(db,), name="hpo-warm-up", daemon=True).start()
        if adb is not None:
            await adb.open()
        try:
            yield
        finally:
            reaper.cancel()
            if adb is not None:
                await adb.close()
            await run_in_threadpool(refiller.stop)
            await run_in_threadpool(keeper.stop)
            db.dispose()
            gc.unfreeze()  # a process that starts apps again (tests) can collect this one's cycles

    # The API docs are served by the dashboard router from assets in our own packages (offline).
    app = FastAPI(title="hpo", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.db = db
    app.state.settings = settings
    app.state.server_settings = server
    studies_service.configure(server.max_spec_cells)
    key = signing_key.load(settings.session_secret, server.secret_file)
    app.state.auth = authenticator = Authenticator(db, settings.api_token, key)
    errors.install(app)
    openapi.install(app)
    routers = (health, studies, trials, workers, analysis, charts, pipelines, dashboard, signin)
    for module in routers:
        app.include_router(module.router)
    # Outermost last: the pages' content policy, HTML error pages for browsers, the size limit, then
    # credentials, then the hostile-input check of bodies, then the direct path of claims and heartbeats.
    app.add_middleware(HotPath, adb=adb)
    app.add_middleware(HostileInput, body_seconds=server.body_seconds)
    app.add_middleware(
        Auth,
        authenticator=authenticator,
        max_unauthenticated=server.max_unauthenticated,
        max_uploads_per_token=server.max_uploads_per_token,
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HtmlErrors)
    app.add_middleware(PagePolicy)
    return app


async def _reap_forever(db: Database, interval: float) -> None:
    """Requeues expired leases even when no worker is claiming, so listings tell the truth."""
    while True:
        await asyncio.sleep(interval)
        try:
            reaped = await run_in_threadpool(leases.reap_expired, db)
            if reaped:
                _log.info("requeued %d trials whose lease expired", reaped)
        except StorageError as exc:  # the database is away: one line, not a traceback a tick
            _log.warning("lease reaper: %s; retrying", one_line(exc))
        except Exception:  # the loop must outlive anything else too
            _log.exception("lease reaper failed; retrying")
