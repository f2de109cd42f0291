"""Uploads in flight: requests whose body is still arriving, counted per key (one token, or every
anonymous client together), so slow senders hold a bounded share of the server and never the
requests that have their body (docs/security.md, "Slow clients").

A request whose whole body has been received is never an upload. Under `hpo server` a body of at
most `hpo.server.api.guards.protocol.SMALL_BODY` bytes (a sign-in form, a claim, most metrics) is
received whole before the request starts, so only larger bodies and chunked ones count; the
protocol says whether a body is complete through the scope extension `BODY_ARRIVED`. Under another
ASGI server every request with a body counts until the app has read it. Past a key's limit a
request that is still receiving its body is refused at once (503); a counted upload stops counting
when the app has read its last byte (or ends)."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope

BODY_ARRIVED = "hpo.body_arrived"


def has_body(scope: Scope) -> bool:
    """Whether the request declares a body (a Content-Length above 0, or Transfer-Encoding)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def body_arrived(scope: Scope) -> bool:
    """Whether the protocol has received the request's whole body (False when it cannot say)."""
    check = scope.get("extensions", {}).get(BODY_ARRIVED)
    return bool(check is not None and check())


class Admitted:
    """A request let in: `receive` is what the app must read its body with; `release()` (idempotent)
    ends its count when the app ends."""

    __slots__ = ("_pool", "_key", "_receive", "receive")

    def __init__(self, receive: Receive, pool: Uploads | None = None, key: str = "") -> None:
        self._pool, self._key, self._receive = pool, key, receive
        self.receive: Receive = self._counted if pool is not None else receive

    async def _counted(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.release()  # the body is in (or the client went away): no longer an upload
        return message

    def release(self) -> None:
        if self._pool is not None:
            self._pool._done(self._key)
            self._pool = None


class Uploads:
    """At most `limit` uploads in flight per key. One event loop per server process: no locks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._uploads: dict[str, int] = {}

    def in_flight(self, key: str) -> int:
        return self._uploads.get(key, 0)

    def admit(self, key: str, scope: Scope, receive: Receive) -> Admitted | None:
        """The request admitted (counted while its body arrives), or None: refuse it (503)."""
        if not has_body(scope) or body_arrived(scope):
            return Admitted(receive)
        count = self._uploads.get(key, 0)
        if count >= self.limit:
            return None
        self._uploads[key] = count + 1
        return Admitted(receive, self, key)

    def _done(self, key: str) -> None:
        left = self._uploads.get(key, 0) - 1
        if left > 0:
            self._uploads[key] = left
        else:
            self._uploads.pop(key, None)  # tokens come and go: the table holds only those with uploads
