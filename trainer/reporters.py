"""Where a run's numbers go (no torch import).

`train()` always appends every metric to `out_dir/metrics.jsonl` through `MetricsFile`, whatever
reporter it is given, one `{"step": N, "name": "split/name", "value": V}` object a line (non-finite
values as the strings "NaN", "Infinity", "-Infinity"). The worker tails that file by byte offset, so
a server outage buffers on disk (docs/worker-protocol.md, "Retries"). A `Reporter` is told about the
same points and about kept checkpoints, and is asked whether to stop. Only rank 0 has one."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Protocol, runtime_checkable


@runtime_checkable
class Reporter(Protocol):
    """Rank 0's link to whoever runs the trial (the worker's HTTP reporter, `hpo train`'s console).

    - `metrics(step, values)`: called after the points were appended to metrics.jsonl (they may
      still sit in the file's buffer for up to a second; every point up to a checkpoint's step is
      flushed before `checkpoint` is called).
    - `checkpoint(step, path, objective_value)`: a checkpoint was written and kept; the objective is
      None for checkpoints not taken at an evaluation (periodic, stop).
    - `should_stop()`: polled once per step; must not block. When it answers True, every rank
      stops after the current step, a checkpoint is written and `train()` answers `stopped`.
    - optional `checkpoints_deleted(steps)`: retention deleted the files of these steps (called
      before the `checkpoint` whose save triggered it), so whoever records checkpoints can forget
      them; a reporter without the method is simply not told (`report_deleted`)."""

    def metrics(self, step: int, values: dict[str, float]) -> None: ...

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None: ...

    def should_stop(self) -> bool: ...


def report_deleted(reporter: Reporter, steps: list[int]) -> None:
    """Tells `reporter` which checkpoint files retention deleted, when it wants to know."""
    hook = getattr(reporter, "checkpoints_deleted", None)
    if steps and hook is not None:
        hook(list(steps))


class NullReporter:
    """Reports nowhere and never stops (ranks other than 0, or `train(..., reporter=None)`)."""

    def metrics(self, step: int, values: dict[str, float]) -> None:
        return None

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        return None

    def should_stop(self) -> bool:
        return False


# The signal that stopped this process's run, so `hpo train` exits 130 after a Ctrl-C but 0 after
# a SIGTERM (a supervisor's orderly stop).
last_stop_signal: int | None = None


def record_stop_signal(signum: int) -> None:
    global last_stop_signal
    last_stop_signal = signum


class ConsoleReporter(NullReporter):
    """`hpo train`'s reporter: one line per evaluation on stdout, and SIGINT / SIGTERM ask the run
    to checkpoint and stop (a second SIGINT interrupts at once)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stdout
        self._stop = False

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        record_stop_signal(signum)
        self._stop = True
        print(f"signal {signum}: stopping after this step (checkpoint first)", file=self._stream, flush=True)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if not any(name.startswith("valid/") for name in values):
            return
        shown = [f"{n} {values[n]:.4g}" for n in ("valid/loss", "valid/error_rate", "train/loss") if n in values]
        throughput = values.get("train/examples_per_second")
        tail = f"  ({throughput:,.0f} ex/s)" if throughput is not None and math.isfinite(throughput) else ""
        print(f"step {step:>7}  " + "  ".join(shown) + tail, file=self._stream, flush=True)

    def should_stop(self) -> bool:
        return self._stop


def format_value(value: float) -> str:
    """A float as a JSON value: `repr` for finite numbers (round-trips exactly), else the strings."""
    if math.isfinite(value):
        return repr(float(value))
    if math.isnan(value):
        return '"NaN"'
    return '"Infinity"' if value > 0 else '"-Infinity"'


class MetricsFile:
    """Appends metric points to `metrics.jsonl`. Points wait in memory and are formatted and handed
    to the OS together at least every `flush_seconds` (readers see them then); `flush()`, which
    the loop calls before every checkpoint, also makes them durable, so after a crash the file
    covers at least the newest checkpoint (resume cuts what lies past it). Writing every step's
    lines at once cost 12 us a step on a 1 ms step, and an fsync every second a few more."""

    def __init__(self, path: Path, flush_seconds: float = 1.0) -> None:
        self.path = path
        self._handle = path.open("a", encoding="utf-8")
        self._flush_seconds = flush_seconds
        self._last_flush = time.monotonic()
        self._names: dict[str, str] = {}
        self._pending: list[tuple[int, Mapping[str, float]]] = []

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Takes `values` as it is: the caller must not change the mapping afterwards."""
        self._pending.append((step, values))
        now = time.monotonic()
        if now - self._last_flush >= self._flush_seconds:
            self._write_pending()
            self._handle.flush()
            self._last_flush = now

    def flush(self) -> None:
        """Durable: written through to the disk."""
        self._write_pending()
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._last_flush = time.monotonic()

    def _write_pending(self) -> None:
        lines = []
        for step, values in self._pending:
            for name, value in values.items():
                quoted = self._names.get(name)
                if quoted is None:
                    quoted = self._names[name] = json.dumps(name)
                lines.append(f'{{"step": {step}, "name": {quoted}, "value": {format_value(value)}}}\n')
        self._pending.clear()
        self._handle.write("".join(lines))

    def close(self) -> None:
        if not self._handle.closed:
            self.flush()
            self._handle.close()

    @staticmethod
    def truncate_after(path: Path, step: int) -> int:
        """Rewrites `path` (atomically) without the points of steps above `step` and without any
        torn last line, so a resumed run appends without duplicates or gaps. Answers how many
        points were dropped. `step = -1` empties the file."""
        if not path.exists():
            return 0
        kept, dropped = [], 0
        with path.open("rb") as handle:
            for line in handle:
                point = _parse(line)
                if point is not None and point <= step:
                    kept.append(line)
                else:
                    dropped += 1
        if dropped:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"".join(kept))
            os.replace(tmp, path)
        return dropped


def _parse(line: bytes) -> int | None:
    """The step of a whole metrics line, or None for a torn or foreign one."""
    if not line.endswith(b"\n"):
        return None
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
