"""Plain text output shared by the CLI's commands: tables, numbers and a study's progress line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_FINISHED = ("completed", "infeasible", "failed", "cancelled")


def progress_line(counts: dict[str, int], width: int = 24) -> str:
    """`[########........] 12/48 finished (3 running, 1 infeasible)`."""
    total = sum(counts.values())
    finished = sum(counts.get(s, 0) for s in _FINISHED)
    filled = int(round(width * finished / total)) if total else 0
    extra = [f"{counts[s]} {s}" for s in ("running", "infeasible", "failed", "cancelled") if counts.get(s)]
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total} finished{tail}"


def render_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A plain text table with columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
