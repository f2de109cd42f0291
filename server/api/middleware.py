"""ASGI middleware: the request size limit (credentials: `auth.py`; hostile bodies: `hostile.py`)."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuses bodies over `max_bytes` with 413, whether or not they declare Content-Length."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _reply(send, 413, f"request body over {self.max_bytes} bytes")
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                # An HTTPException: the one kind FastAPI's body parsing lets through (as a 413).
                raise _TooLarge(413, f"request body over {self.max_bytes} bytes")
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge as exc:
            await _reply(send, 413, str(exc.detail))


class _TooLarge(HTTPException):
    pass
