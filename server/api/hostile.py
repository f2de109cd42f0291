"""The one place that refuses text the database cannot keep, before any route sees it.

Postgres refuses a NUL character in text and JSONB, and no driver can encode a lone UTF-16
surrogate (`"\\ud800"`); SQLite stores both and then fails on every read of that row. So every request
body is checked as it is received, on its raw bytes (a regex over the JSON escapes, and strict UTF-8),
and the query string likewise: a 422 naming the part, never a 503 the worker would retry forever.
The body must also arrive within `BODY_SECONDS`: a client that stalls mid-upload is cut off with a
408 instead of holding a server slot for ever."""

from __future__ import annotations

import asyncio
import codecs
import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_SECONDS = 30.0
_HIGH = rb"\\u[dD][89abAB][0-9a-fA-F]{2}"
_LOW = rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_BAD_ESCAPE = re.compile(rb"\\u0000|" + _HIGH + rb"(?!" + _LOW + rb")|(?<!" + _HIGH + rb")" + _LOW)
_BAD_QUERY = re.compile(rb"%00|%[eE][dD]%[aAbB][0-9a-fA-F]|\x00")
_KEEP = 64  # bytes carried to the next chunk, so an escape split across chunks is still seen


def refusal(field: str, reason: str) -> HTTPException:
    """An HTTPException FastAPI lets through its body parsing, in the API's 422 shape."""
    detail: Any = [{"field": field, "reason": reason}]  # Starlette passes any detail through
    return HTTPException(422, detail=detail)


def bad_escape(data: bytes, final: bool = True) -> str | None:
    """Why `data` (JSON text) holds a NUL or a lone surrogate, or None. A match preceded by an odd
    number of backslashes is an escaped backslash followed by plain text, not an escape."""
    limit = len(data) if final else len(data) - 12
    for match in _BAD_ESCAPE.finditer(data):
        if match.start() >= limit:
            break
        start, backslashes = match.start(), 0
        while start - backslashes - 1 >= 0 and data[start - backslashes - 1] == 0x5C:
            backslashes += 1
        if backslashes % 2:
            continue
        text = match.group().decode()
        return "must not contain NUL characters" if text == "\\u0000" else f"holds a lone surrogate {text}"
    return None


class HostileInput:
    def __init__(self, app: ASGIApp, body_seconds: float = BODY_SECONDS) -> None:
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
        await self.app(scope, self._checked(receive), send)

    def _checked(self, receive: Receive) -> Receive:
        decoder = codecs.getincrementaldecoder("utf-8")()
        carried = b""
        seconds = self.body_seconds
        done = False

        async def checked() -> Message:
            nonlocal carried, done
            if done:  # later calls wait for a disconnect (streaming responses): no deadline then
                return await receive()
            try:
                async with asyncio.timeout(seconds):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, detail=f"request body not received within {seconds:g} s") from None
            if message["type"] != "http.request":
                return message
            chunk: bytes = message.get("body", b"")
            final = done = not message.get("more_body", False)
            try:
                decoder.decode(chunk, final)
            except UnicodeDecodeError:
                raise refusal("body", "is not valid UTF-8") from None
            data = carried + chunk
            reason = bad_escape(data, final)
            if reason is not None:
                raise refusal("body", reason)
            carried = data[-_KEEP:]
            return message

        return checked


async def _reply(send: Send, field: str, reason: str) -> None:
    import json

    body = json.dumps({"detail": [{"field": field, "reason": reason}], "message": f"{field}: {reason}"}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 422, "headers": headers})
    await send({"type": "http.response.body", "body": body})
