"""The credentials check: an ASGI middleware that maps each request to the permission it needs and
asks `hpo.server.auth.tokens` whether the caller holds it (docs/security.md has the table).

Until a token exists (and `HPO_API_TOKEN` is unset) every call is open, as on a laptop. From then on
every call but the health checks and the sign-in page needs a bearer token or a dashboard session:
401 without credentials (a browser asking for a page is sent to /signin instead), 403 when the
role may not. Writes authenticated by the session cookie must also echo the page's CSRF token
(header `X-HPO-CSRF`), on top of the cookie's SameSite=Strict.

Unauthenticated requests that the server does serve once tokens exist (the sign-in page and form,
sign-out, static files) are capped at `max_unauthenticated` in progress per server process; more
answer 503 at once. So a crowd of anonymous clients, slow ones included, holds a bounded share of
the server and never the slots authenticated calls need. Of that cap, uploads still arriving may
hold all but a quarter (`hpo.server.api.guards.uploads`): the rest is kept for requests that have their
body, so a crowd of slow anonymous uploads never keeps a person from signing in. Each token may
have `max_uploads_per_token` uploads in flight; past it, that token's slow uploads answer 503 and
every other request (its own that come whole included) is served. The health checks pass ahead of
everything, with no credential and no cap."""

from __future__ import annotations

import hmac
import json
import logging
import re
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from hpo.server.api.errors import error_response
from hpo.server.api.guards.log_tally import Tally
from hpo.server.api.guards.uploads import Uploads
from hpo.server.auth.tokens import Authenticator, Principal
from hpo.server.errors import StorageError

SESSION_COOKIE = "hpo_session"
CSRF_COOKIE = "hpo_csrf"
CSRF_HEADER = "x-hpo-csrf"
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
OPEN_PATHS = HEALTH_PATHS | {"/signin", "/signout"}
_log = logging.getLogger("hpo.server")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CLAIM = "/api/v1/workers/claim"
_WORKER_CALLS = frozenset({_CLAIM, "/api/v1/workers/health"})
_LEASED_WRITE = re.compile(r"/api/v1/trials/(\d{1,10})/(heartbeat|metrics|checkpoints|complete|fail)")
# What a trial process may post with its trial token (worker/reporter.py).
_TRIAL_WRITES = frozenset({"metrics", "checkpoints"})


def required_permission(method: str, path: str) -> str | None:
    """`read`, `write` or `worker` for a request; None for the open paths."""
    if path in OPEN_PATHS or path.startswith("/static/"):
        return None
    if method in _SAFE_METHODS:
        return "read"
    if method == "POST" and (path in _WORKER_CALLS or _LEASED_WRITE.fullmatch(path)):
        return "worker"
    return "write"


def allows(principal: Principal, method: str, path: str, permission: str) -> bool:
    if principal.may(permission):
        return True
    if principal.role == "trial" and method == "POST":
        match = _LEASED_WRITE.fullmatch(path)
        return bool(match and match[2] in _TRIAL_WRITES and int(match[1]) == principal.trial_id)
    return False


class Auth:
    """Pure ASGI (no request object is built for the common, cached case)."""

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator,
        max_unauthenticated: int = 32,
        max_uploads_per_token: int = 64,
    ) -> None:
        self.app, self.auth = app, authenticator
        self.max_unauthenticated, self.unauthenticated = max_unauthenticated, 0
        self._refused = Tally(_log, f"refused %d unauthenticated requests over {max_unauthenticated} in progress")
        # A quarter of the anonymous cap (at least one) is kept for requests that have their body:
        # uploads still arriving may take the rest.
        self.anonymous_uploads = Uploads(max(0, max_unauthenticated - max(1, max_unauthenticated // 4)))
        self.token_uploads = Uploads(max_uploads_per_token)
        over = f"over its {max_uploads_per_token} in flight (HPO_MAX_UPLOADS_PER_TOKEN)"
        self._refused_uploads = Tally(_log, f"refused %d uploads of a token {over}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        permission = required_permission(method, path)
        headers = _headers(scope)
        try:
            enabled = await self._enabled()
            principal, via_cookie = await self._principal(headers) if enabled else (None, False)
        except StorageError as exc:  # the database is away: 503 as from any route, not a 500
            await error_response(exc)(scope, receive, send)
            return
        if not enabled:
            await self.app(scope, receive, send)
            return
        if permission is None:  # sign-in, sign-out, static files: served to anyone, within the cap
            if principal is None:
                await self._unauthenticated_call(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if principal is None:
            await self._unauthenticated(scope, headers, send)
            return
        if not allows(principal, method, path, permission):
            await _reply(send, 403, f"the {principal.role} role may not {method} {path}")
            return
        if via_cookie and method not in _SAFE_METHODS and not self._csrf_ok(principal, headers):
            await _reply(send, 403, f"a write from a signed-in page needs its CSRF token ({CSRF_HEADER} header)")
            return
        scope.setdefault("state", {})["principal"] = principal
        # Every trial token shares one count: a worker token can claim many trials, each with a token.
        key = principal.token_hash or principal.role
        limit = self.token_uploads.limit
        busy = f"this token has {limit} uploads in progress (HPO_MAX_UPLOADS_PER_TOKEN); retry shortly"
        await self._as_upload(self.token_uploads, key, self._refused_uploads, busy, scope, receive, send)

    async def _unauthenticated_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An open path without a valid credential: served while fewer than the cap are."""
        if self.unauthenticated >= self.max_unauthenticated:
            self._refused.count()
            busy = "too many unauthenticated requests in progress; retry shortly"
            await _reply(send, 503, busy, [(b"retry-after", b"1"), (b"connection", b"close")])
            return
        self.unauthenticated += 1  # one event loop per process: no await between check and count
        try:
            # Uploads still arriving hold their share of the cap: past it, this one is refused.
            busy = "too many unauthenticated uploads in progress; retry shortly"
            await self._as_upload(self.anonymous_uploads, "", self._refused, busy, scope, receive, send)
        finally:
            self.unauthenticated -= 1

    async def _as_upload(
        self, uploads: Uploads, key: str, refused: Tally, busy: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serves the request while `uploads` admits it under `key` (a request whose body is
        still arriving counts until it has arrived); a 503 at once otherwise."""
        admitted = uploads.admit(key, scope, receive)
        if admitted is None:
            refused.count()
            await _reply(send, 503, busy, [(b"retry-after", b"1"), (b"connection", b"close")])
            return
        try:
            await self.app(scope, admitted.receive, send)
        finally:
            admitted.release()

    async def _enabled(self) -> bool:
        if self.auth.enabled_is_cached():
            return self.auth.enabled()
        return await run_in_threadpool(self.auth.enabled)

    async def _principal(self, headers: dict[str, str]) -> tuple[Principal | None, bool]:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            token = token.strip()
            hit, principal = self.auth.cached(token)
            if not hit:
                principal = await run_in_threadpool(self.auth.principal, token)
            return principal, False
        cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
        if cookie:
            return await run_in_threadpool(self.auth.session_principal, cookie), True
        return None, False

    def _csrf_ok(self, principal: Principal, headers: dict[str, str]) -> bool:
        given = headers.get(CSRF_HEADER, "")
        expected = self.auth.csrf_token(principal.session) if principal.session else ""
        return bool(expected) and hmac.compare_digest(given.encode("latin-1"), expected.encode())

    async def _unauthenticated(self, scope: Scope, headers: dict[str, str], send: Send) -> None:
        path = scope["path"]
        if scope["method"] == "GET" and not path.startswith("/api/") and "text/html" in headers.get("accept", ""):
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + (f"?{query}" if query else "")
            location = f"/signin?next={quote(target, safe='')}"
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        await _reply(
            send,
            401,
            "this server needs a token: Authorization: Bearer <token> (hpo token create)",
            [(b"www-authenticate", b'Bearer realm="hpo"')],
        )


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def _reply(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
