"""ASGI middleware: the request size limit and the pages' content policy (credentials: `auth.py`;
hostile bodies: `hostile.py`)."""

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


# Images on a page load only from the dashboard itself, or from data: and blob: URLs its own script
# makes (Plotly's PNG download draws through one): a note's Markdown may name any URL, and a remote
# image would tell its host who read the note, and when (docs/security.md, "The dashboard").
PAGE_POLICY = b"img-src 'self' data: blob:"


class PagePolicy:
    """Adds `Content-Security-Policy: img-src ...` to every HTML answer (pages, error pages)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/api/"):  # the API answers no pages
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                found = {bytes(k).lower(): bytes(v) for k, v in headers}
                html = found.get(b"content-type", b"").startswith(b"text/html")
                if html and b"content-security-policy" not in found:
                    message = {**message, "headers": [*headers, (b"content-security-policy", PAGE_POLICY)]}
            await send(message)

        await self.app(scope, receive, with_policy)
