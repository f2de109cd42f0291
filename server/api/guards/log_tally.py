"""One log line a second at most for events that an attacker can repeat at will (refusals), with
how many happened since the last line, so a flood of them cannot flood the log."""

from __future__ import annotations

import logging
import time


class Tally:
    def __init__(self, logger: logging.Logger, message: str, seconds: float = 1.0) -> None:
        """`message` takes one `%d`: how many events the line stands for."""
        self._logger, self._message, self._seconds = logger, message, seconds
        self._count = 0
        self._logged_at = float("-inf")

    def count(self) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._logged_at >= self._seconds:
            self._logger.warning(self._message, self._count)
            self._count, self._logged_at = 0, now
