"""uvicorn's HTTP protocol with a header read deadline: a connection that opens, or starts a new
request on a kept-alive connection, must finish sending its request line and headers within
`HEADER_SECONDS`, or it is closed. uvicorn has no such limit of its own (its keep-alive timer only
runs between requests), so a client trickling headers could hold a connection slot for ever.
`hpo server` passes this class as uvicorn's `http`."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_SECONDS = 10.0


class HeaderDeadlineProtocol(HttpToolsProtocol):
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._start_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _start_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(HEADER_SECONDS, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()
