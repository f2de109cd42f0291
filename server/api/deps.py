"""Typed dependencies the routes share."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from hpo.server.db import Database
from hpo.settings import Settings


# Async on purpose: a plain `def` dependency runs on the threadpool, a hop per request for a
# one-line lookup.
async def _database(request: Request) -> Database:
    return request.app.state.db  # type: ignore[no-any-return]


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


DatabaseDep = Annotated[Database, Depends(_database)]
SettingsDep = Annotated[Settings, Depends(_settings)]


# Ids are 32-bit integers in the database: anything outside is "not found" territory, refused here.
StudyId = Annotated[int, Path(ge=1, le=2**31 - 1, description="study id")]
TrialId = Annotated[int, Path(ge=1, le=2**31 - 1, description="trial id")]
