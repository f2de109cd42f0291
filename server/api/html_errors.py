"""HTML error pages for people: a browser (a request that accepts text/html) asking for a page
that does not exist, or with bad query parameters, gets a page with the reason and a way back.
API clients (paths under /api/, or no text/html in Accept) keep the JSON bodies of `errors.py`."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hpo.server.api.routes.dashboard import _page

_TITLES = {400: "Bad request", 404: "Not found", 405: "Method not allowed", 409: "Conflict", 422: "Invalid request"}


def wants_html(scope: Scope) -> bool:
    """A browser navigating to a page (never the JSON API, whatever it accepts)."""
    if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
        return False
    if str(scope.get("path", "")).startswith("/api/"):
        return False
    accept = dict(scope.get("headers", [])).get(b"accept", b"").decode("latin-1")
    return "text/html" in accept


def error_page(status: int, body: Any) -> bytes:
    """The page for an error status and the JSON body the API would have answered."""
    detail = body.get("detail") if isinstance(body, dict) else None
    details = detail if isinstance(detail, list) else []
    message = body.get("message") if isinstance(body, dict) and body.get("message") else detail
    if not isinstance(message, str):
        message = _TITLES.get(status, "Error")
    return bytes(
        _page("error.html", status=status, title=_TITLES.get(status, "Error"), message=message, details=details).body
    )


class HtmlErrors:
    """Turns 4xx JSON answers to browser page requests into HTML pages (see module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not wants_html(scope):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = dict(message.get("headers", []))
                if status in _TITLES and headers.get(b"content-type", b"").startswith(b"application/json"):
                    start = message
                    return
                await send(message)
            elif start is not None:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    await _send_page(send, int(start["status"]), b"".join(chunks))
            else:
                await send(message)

        await self.app(scope, receive, capture)


async def _send_page(send: Send, status: int, raw: bytes) -> None:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    page = error_page(status, body)
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(page)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": page})
