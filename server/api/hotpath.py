"""The direct path of the two calls every worker makes most: `POST /api/v1/workers/claim` and
`POST /api/v1/trials/{id}/heartbeat`, on Postgres.

It sits inside every other middleware (the size limit, credentials, the hostile-input check of
bodies: they run for these calls as for any other) and in front of FastAPI's routing, dependency
injection and thread pool, which cost a claim more CPU than the rest of it (docs/decisions.md).
It answers only what it answers exactly as the routes do: a valid JSON body (the routes' own
pydantic models, parsed from the raw bytes) and the common outcomes (a claim, 204, a renewed
lease). Everything else goes on to the routes unchanged, the body it read handed along: a body
that is not valid (the 422 that names the field), another content type, a trial id out of range,
a heartbeat whose lease was lost (404 or 409), a worker that may not run the trial it was given,
SQLite, or a server whose async pool is not open. The service's own errors map through
`errors.error_response`, the one mapping."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpo.policy import ExecutionPolicy
from hpo.server.api.errors import error_response
from hpo.server.api.routes.workers import _runs
from hpo.server.errors import HpoError
from hpo.server.schemas import ClaimRequest, LeaseRequest
from hpo.server.trials import leases, leases_async

_CLAIM = "/api/v1/workers/claim"
_HEARTBEAT = re.compile(r"/api/v1/trials/(\d{1,10})/heartbeat")
_MAX_ID = 2**31 - 1
_JSON = [(b"content-type", b"application/json")]


class HotPath:
    def __init__(self, app: ASGIApp, adb: leases_async.AsyncDatabase | None) -> None:
        self.app, self.adb = app, adb

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adb = self.adb
        if scope["type"] != "http" or scope["method"] != "POST" or adb is None:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        match = None if path == _CLAIM else _HEARTBEAT.fullmatch(path)
        trial_id = int(match[1]) if match else 0
        hot = path == _CLAIM or 1 <= trial_id <= _MAX_ID
        if not hot or not adb.ready() or not _json(scope):
            await self.app(scope, receive, send)
            return
        try:
            body = await _body(receive)
        except HTTPException as exc:  # from the hostile-input check: the routes' handler answers it
            await self.app(scope, _raising(exc), send)
            return
        if body is None:  # the client went away
            return
        onward = _replaying(body, receive)
        try:
            if trial_id:
                done = await self._heartbeat(scope, adb, trial_id, body, send)
            else:
                done = await self._claim(scope, adb, body, send)
        except HpoError as exc:
            await error_response(exc)(scope, onward, send)
            return
        if not done:
            await self.app(scope, onward, send)

    async def _claim(self, scope: Scope, adb: leases_async.AsyncDatabase, raw: bytes, send: Send) -> bool:
        try:
            body = ClaimRequest.model_validate_json(raw)
        except ValidationError:
            return False
        settings = scope["app"].state.settings
        offered = body.resources
        answer = await leases_async.claim(adb, body.worker_id, offered.cpus, offered.gpus, settings.lease_seconds)
        if answer is not None and body.capabilities is not None:
            policy = ExecutionPolicy(
                workload_globs=tuple(body.capabilities.workloads),
                command_prefixes=tuple(tuple(p) for p in body.capabilities.commands),
                env_globs=tuple(body.capabilities.env),
            )
            if not _runs(policy, dict(answer.config.get("trainer") or {})):
                # Handed back as it was; the route's search (skipping that study) takes over.
                await run_in_threadpool(leases.hand_back, adb.db, answer.trial_id, answer.lease_id)
                return False
        if answer is None:
            await _send(send, 204, b"")
            return True
        auth = scope["app"].state.auth
        enabled = auth.enabled() if auth.enabled_is_cached() else await run_in_threadpool(auth.enabled)
        if enabled:
            answer = answer.model_copy(update={"trial_token": auth.trial_token(answer.trial_id, answer.lease_id)})
        await _send(send, 200, answer.model_dump_json().encode())
        return True

    async def _heartbeat(
        self, scope: Scope, adb: leases_async.AsyncDatabase, trial_id: int, raw: bytes, send: Send
    ) -> bool:
        try:
            body = LeaseRequest.model_validate_json(raw)
        except ValidationError:
            return False
        settings = scope["app"].state.settings
        answer = await leases_async.heartbeat(adb, trial_id, body.lease_id, settings.lease_seconds)
        if answer is None:
            return False
        await _send(send, 200, answer.model_dump_json().encode())
        return True


def _json(scope: Scope) -> bool:
    """A JSON body as FastAPI reads one (`application/json`); other types go to the routes."""
    for key, value in scope["headers"]:
        if key == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False


async def _body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for the routes: the body already read, then the connection's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _raising(exc: HTTPException) -> Receive:
    async def receive() -> Message:
        raise exc

    return receive


async def _send(send: Send, status: int, body: bytes) -> None:
    headers: list[Any] = [*_JSON, (b"content-length", str(len(body)).encode())] if body else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
