"""The one place that refuses text the database cannot keep, before any route sees it.

Postgres refuses a NUL character in text and JSONB, and no driver can encode a lone UTF-16
surrogate (`"\\ud800"`); SQLite stores both and then fails on every read of that row. So every request
body is checked as it is received, on its raw bytes (a scan of the JSON escapes; bytes that are not
UTF-8 fail JSON parsing, a 422 too), and the query string likewise: a 422 naming the part, never a
503 the worker would retry forever. The whole body must also arrive within `BODY_SECONDS` of the
request's start (not per read: a client trickling a byte now and then must not hold a server slot
for ever): past it the request is answered 408. A request timed out or abandoned mid-body (the
client went away) logs one line, never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_SECONDS = 30.0
_log = logging.getLogger("hpo.server")
# Candidates only (a NUL escape or any surrogate escape); whether a surrogate is paired is decided
# in Python, which runs only when a body holds one (rare), so the common body costs one C scan.
_CANDIDATE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_BAD_QUERY = re.compile(rb"%00|%[eE][dD]%[aAbB][0-9a-fA-F]|\x00")
_KEEP = 64  # bytes carried to the next chunk, so an escape split across chunks is still seen


def refusal(field: str, reason: str) -> HTTPException:
    """An HTTPException FastAPI lets through its body parsing, in the API's 422 shape."""
    detail: Any = [{"field": field, "reason": reason}]  # Starlette passes any detail through
    return HTTPException(422, detail=detail)


def bad_escape(data: bytes, final: bool = True) -> str | None:
    """Why `data` (JSON text) holds a NUL or a lone surrogate, or None. A match preceded by an odd
    number of backslashes is an escaped backslash followed by plain text, not an escape."""
    if b"\\" not in data:  # one memchr: most bodies hold no escape at all
        return None
    limit = len(data) if final else len(data) - 12
    for match in _CANDIDATE.finditer(data):
        start = match.start()
        if start >= limit:
            break
        if _escaped(data, start):
            continue
        text = match.group().decode()
        if text == "\\u0000":
            return "must not contain NUL characters"
        unit = int(text[2:], 16)
        if unit < 0xDC00 and _surrogate_at(data, start + 6, low=True):
            continue  # a high surrogate followed by a low one: a valid pair
        paired = start >= 6 and _surrogate_at(data, start - 6, low=False) and not _escaped(data, start - 6)
        if unit >= 0xDC00 and paired:
            continue  # the low half of a pair
        return f"holds a lone surrogate {text}"
    return None


def _escaped(data: bytes, start: int) -> bool:
    backslashes = 0
    while start - backslashes - 1 >= 0 and data[start - backslashes - 1] == 0x5C:
        backslashes += 1
    return backslashes % 2 == 1


def _surrogate_at(data: bytes, at: int, *, low: bool) -> bool:
    chunk = data[at : at + 6]
    if len(chunk) < 6 or chunk[:2] != b"\\u" or chunk[2] not in b"dD" or not all(c in _HEX for c in chunk[3:]):
        return False
    unit = int(chunk[2:].decode(), 16)
    return 0xDC00 <= unit <= 0xDFFF if low else 0xD800 <= unit <= 0xDBFF


class HostileInput:
    def __init__(self, app: ASGIApp, body_seconds: float | None = None) -> None:
        self.app, self.body_seconds = app, body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"")
        if query and _BAD_QUERY.search(query):
            await _reply(send, "query", "must not contain NUL characters or surrogates")
            return
        if "\x00" in scope["path"]:
            await _reply(send, "path", "must not contain NUL characters")
            return
        await self.app(scope, self._checked(scope, receive), send)

    def _checked(self, scope: Scope, receive: Receive) -> Receive:
        carried = b""
        seconds = self.body_seconds if self.body_seconds is not None else BODY_SECONDS
        deadline = asyncio.get_running_loop().time() + seconds
        received = 0
        done = False

        async def checked() -> Message:
            nonlocal carried, done, received
            if done:  # later calls wait for a disconnect (streaming responses): no deadline then
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                done = True
                _log.warning(
                    "%s: request body not received within %g s (%d bytes came); 408", _who(scope), seconds, received
                )
                detail = f"request body not received within {seconds:g} s"
                raise HTTPException(408, detail=detail, headers={"Connection": "close"}) from None
            if message["type"] != "http.request":
                done = True
                _log.warning("%s: the client went away after %d bytes of the request body", _who(scope), received)
                return message
            chunk: bytes = message.get("body", b"")
            received += len(chunk)
            final = done = not message.get("more_body", False)
            data = carried + chunk
            reason = bad_escape(data, final)
            if reason is not None:
                raise refusal("body", reason)
            carried = data[-_KEEP:]
            return message

        return checked


def _who(scope: Scope) -> str:
    client = scope.get("client")
    path = repr(scope["path"])[1:-1]  # a path may hold a newline (%0A): one line stays one line
    return f"{scope['method']} {path} from {client[0] if client else 'unknown'}"


async def _reply(send: Send, field: str, reason: str) -> None:
    body = json.dumps({"detail": [{"field": field, "reason": reason}], "message": f"{field}: {reason}"}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 422, "headers": headers})
    await send({"type": "http.response.body", "body": body})
