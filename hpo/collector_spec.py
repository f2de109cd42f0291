"""`trainer.metrics`: which collector turns what a script writes into metric points
(worker/collectors.py runs them; the server checks the setting at creation). Standard library only."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLLECTORS = ("file", "stdout", "tensorboard")


@dataclass(frozen=True)
class CollectorSpec:
    """`trainer.metrics`, parsed: `"stdout"`, or `{"collector": "stdout", "pattern": "..."}`,
    `{"collector": "tensorboard", "dir": "tb"}`."""

    collector: str = "file"
    pattern: str | None = None
    dir: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> CollectorSpec:
        """Raises ValueError naming what is wrong (the server turns it into a 422)."""
        if raw is None:
            return cls()
        if isinstance(raw, str):
            raw = {"collector": raw}
        if not isinstance(raw, Mapping):
            raise ValueError('must be "file", "stdout", "tensorboard" or an object {"collector": ...}')
        unknown = set(raw) - {"collector", "pattern", "dir"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} (known: collector, pattern, dir)")
        collector = raw.get("collector", "file")
        if collector not in COLLECTORS:
            raise ValueError(f"collector must be one of {', '.join(COLLECTORS)}, got {collector!r}")
        pattern, folder = raw.get("pattern"), raw.get("dir")
        if pattern is not None:
            _check_pattern(collector, pattern)
        if folder is not None:
            _check_dir(collector, folder)
        return cls(collector, pattern, folder)


def _check_pattern(collector: str, pattern: Any) -> None:
    if collector != "stdout":
        raise ValueError("pattern applies only to the stdout collector")
    if not isinstance(pattern, str) or not 0 < len(pattern) <= 1000:
        raise ValueError("pattern must be a regular expression of 1 to 1,000 characters")
    try:
        groups = re.compile(pattern).groupindex
    except re.error as exc:
        raise ValueError(f"pattern is not a regular expression: {exc}") from None
    if not {"name", "value"} <= set(groups):
        raise ValueError(
            "pattern must have the named groups (?P<name>...) and (?P<value>...), and may have (?P<step>...)"
        )


def _check_dir(collector: str, folder: Any) -> None:
    if collector != "tensorboard":
        raise ValueError("dir applies only to the tensorboard collector")
    if not isinstance(folder, str) or not folder or folder.startswith("/") or ".." in Path(folder).parts:
        raise ValueError("dir must be a relative path below $HPO_OUT_DIR, without '..'")
