"""Assembles the FastAPI application: routers, error mapping, middleware and the lease reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from hpo.settings import Settings

from . import leases
from .api import analysis, dashboard, errors, health, studies, trials, workers
from .api.middleware import BearerToken, BodyLimit
from .bayesian.queue import Refiller
from .db import Database

_log = logging.getLogger("hpo.server")


def create_app(settings: Settings, *, upgrade: bool = True) -> FastAPI:
    """The application over `settings.database_url`; the schema is upgraded on start."""
    db = Database(settings.database_url)
    if upgrade:
        db.upgrade()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap_forever(db, settings.lease_seconds / 4))
        refiller = Refiller(db, processes=settings.bayesian_processes)  # bayesian proposal queues
        refiller.start()
        try:
            yield
        finally:
            reaper.cancel()
            await run_in_threadpool(refiller.stop)
            db.dispose()

    app = FastAPI(title="hpo", version="0.1.0", lifespan=lifespan)
    app.state.db = db
    app.state.settings = settings
    errors.install(app)
    for router in (health.router, studies.router, trials.router, workers.router, analysis.router, dashboard.router):
        app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.api_token:
        app.add_middleware(BearerToken, token=settings.api_token)
    return app


async def _reap_forever(db: Database, interval: float) -> None:
    """Requeues expired leases even when no worker is claiming, so listings tell the truth."""
    while True:
        await asyncio.sleep(interval)
        try:
            reaped = await run_in_threadpool(leases.reap_expired, db)
            if reaped:
                _log.info("requeued %d trials whose lease expired", reaped)
        except Exception:  # the loop must outlive a database hiccup
            _log.exception("lease reaper failed; retrying")
