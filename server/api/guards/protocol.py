"""uvicorn's HTTP protocol with the deadlines and the admission rule that keep slow clients from
holding the server (docs/security.md, "Slow clients"). `hpo server` passes this class as uvicorn's
`http`; uvicorn has none of these of its own.

- Headers: a connection that opens, or starts a new request on a kept-alive connection, must
  finish its request line and headers within `HEADER_SECONDS`, or it is closed.
- Body: the whole body must arrive within `BODY_SECONDS` of the headers' end. The app answers
  408 at that deadline (`hpo.server.api.guards.body`); `BODY_GRACE` later the connection is closed
  whatever the app did. That closes the connections whose request was answered before its body
  arrived (401, 413, 503) and whose client keeps trickling bytes: uvicorn cancels its keep-alive
  timer at every byte received, so such a connection would otherwise never be closed.
- Answered early: a connection whose answer went out before its request body had arrived gets
  `LINGER_SECONDS` to finish sending it (so a client that sent a whole body still reads the answer
  rather than a reset), then it is closed.
- Small bodies first: a request declaring a body of at most `SMALL_BODY` bytes starts (its app
  task is made) only once the body is whole, so until then it holds a connection but no request
  slot; at the body deadline it is answered 408 here and closed. Larger and chunked bodies start
  at once, and the scope's extension `hpo.body_arrived` tells the app whether the body is whole
  yet: the app counts those still arriving (`hpo.server.api.guards.uploads`).
- `--limit-concurrency` counts requests in progress, not open connections, and never refuses
  `GET /healthz` or `/readyz`. Every connection is bounded in time by the deadlines above, but a
  crowd of them must not make the health checks, or the authenticated calls that the app admits
  ahead of unauthenticated ones (`hpo.server.api.guards.credentials`), answer 503."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from hpo.server.api.guards.log_tally import Tally
from hpo.server.api.guards.uploads import BODY_ARRIVED

HEADER_SECONDS = 10.0
# A declared body up to this size is received whole before its request starts (a sign-in form, a
# claim, most metrics batches): while it arrives it holds a connection, as headers do, but no
# request slot, so slow senders of small bodies count in no cap at all. uvicorn's own buffer.
SMALL_BODY = 65536
BODY_SECONDS = 30.0
BODY_GRACE = 1.0
LINGER_SECONDS = 2.0
HEALTH_PATHS = frozenset({b"/healthz", b"/readyz"})
_log = logging.getLogger("hpo.server")


def configure(header_seconds: float, body_seconds: float) -> None:
    """Sets the deadlines from the server's settings (uvicorn builds the protocol itself, in each
    server process, so settings reach it this way; `hpo.server.asgi` calls this)."""
    global HEADER_SECONDS, BODY_SECONDS
    HEADER_SECONDS, BODY_SECONDS = header_seconds, body_seconds


class HeaderDeadlineProtocol(HttpToolsProtocol):
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_complete = True
    _fresh = False  # inside on_headers_complete: a request starting now, not one pipelined earlier
    _waiting: tuple[Any, Any] | None = None  # (cycle, app) of a request waiting for its small body

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(HEADER_SECONDS, self._too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._cancel_body_timer()  # the last request's body is complete: no linger any more
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(HEADER_SECONDS, self._too_slow)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._body_complete = False
        self._body_timer = self.loop.call_later(BODY_SECONDS + BODY_GRACE, self._too_slow)
        # uvicorn's own check counts open connections, which slow clients hold; ours counts
        # requests in progress and lets the health checks through.
        limit, app = self.limit_concurrency, self.app
        if limit is not None and len(self.tasks) >= limit and not self._health_check():
            self.app = _busy
        self.limit_concurrency = None
        self._fresh = True
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency, self.app, self._fresh = limit, app, False
        cycle = self.cycle
        if type(cycle) is RequestResponseCycle:  # its task has not started yet
            cycle.__class__ = OneWriteCycle
        if cycle is not None and cycle.scope is self.scope:
            # Whether this request's whole body is in: the app counts uploads still arriving
            # (`hpo.server.api.guards.uploads`), never one that came with its headers.
            extensions: Any = self.scope.setdefault("extensions", {})
            extensions[BODY_ARRIVED] = lambda: not cycle.more_body

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._fresh and self._small_body_to_come():
            self._waiting = (cycle, app)  # started by on_message_complete, or answered 408 by the deadline
            return
        super()._start_asgi_task(cycle, app)

    def _small_body_to_come(self) -> bool:
        """A declared body of at most SMALL_BODY bytes, not sent on a 100-continue."""
        if self.expect_100_continue:
            return False
        for name, value in self.headers:
            if name == b"content-length":
                return value.isdigit() and 0 < int(value) <= SMALL_BODY
        return False

    def on_message_complete(self) -> None:
        self._body_complete = True
        self._cancel_body_timer()
        super().on_message_complete()
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            super()._start_asgi_task(*waiting)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._body_complete and not self.transport.is_closing():
            self._cancel_body_timer()
            self._body_timer = self.loop.call_later(LINGER_SECONDS, self._too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        if self._waiting is not None:
            self._waiting = None
            _log.warning("%s: the client went away before its request body came; never started", self._who())
        super().connection_lost(exc)

    def _health_check(self) -> bool:
        if self.parser.get_method() not in (b"GET", b"HEAD"):
            return False
        try:
            return httptools.parse_url(self.url).path in HEALTH_PATHS
        except httptools.HttpParserInvalidURLError:
            return False

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _too_slow(self) -> None:
        self._header_timer = self._body_timer = None
        if self._waiting is not None and not self.transport.is_closing():
            # A small body that never came whole: the app never saw the request, so answer here.
            self._waiting = None
            _log.warning("%s: request body not received within %g s; 408", self._who(), BODY_SECONDS)
            body = json.dumps({"detail": f"request body not received within {BODY_SECONDS:g} s"}).encode()
            head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            self.transport.write(head.encode() + b"connection: close\r\n\r\n" + body)
        if not self.transport.is_closing():
            self.transport.close()

    def _who(self) -> str:
        method = self.scope.get("method", "?")
        path = repr(self.scope.get("path", "?"))[1:-1]  # a path may hold a newline: one line stays one
        client = self.scope.get("client")
        return f"{method} {path} from {client[0] if client else 'unknown'}"


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request cycle, writing a response whose body comes in one message (every API
    answer) to the socket once: uvicorn writes the status line and headers at
    `http.response.start` and the body at `http.response.body`, two send() calls, each a TCP
    segment that wakes the client (on loopback the kernel charges the delivery to the sender: two
    fifths of a server process's CPU under bench/server_bench.py's claims)."""

    _held: Any = None

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started and self._held is None:
            self._held = message
            return
        held, self._held = self._held, None
        if held is None:
            await super().send(message)
            return
        if message["type"] != "http.response.body" or message.get("more_body", False):
            await super().send(held)
            await super().send(message)
            return
        transport = self.transport
        self.transport = gathered = _Gathered(transport)  # type: ignore[assignment]
        try:
            await super().send(held)
            await super().send(message)
        finally:
            self.transport = transport
            gathered.flush()


class _Gathered:
    """A transport that holds what is written until `flush()` (or a close) writes it at once."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def flush(self) -> None:
        if self.chunks:
            data, self.chunks = b"".join(self.chunks), []
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


_refused = Tally(_log, "refused %d requests over --limit-concurrency (requests in progress)")


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """503 for a request over `--limit-concurrency`: at once, with Retry-After, closing the
    connection; one log line a second at most, counting the refusals."""
    _refused.count()
    body = json.dumps({"detail": "the server is busy (too many requests in progress); retry shortly"}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
