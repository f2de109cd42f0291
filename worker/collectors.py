"""Metrics from what a script already writes (`trainer.metrics`, docs/scripts.md).

A command's metric points reach hpo through `$HPO_OUT_DIR/metrics.jsonl`, which rank 0's runner
tails. A collector fills that file from what an unchanged script writes anyway, the way Katib's
stdout and TensorBoard collectors do:

- `file` (the default): the script writes `metrics.jsonl` itself; nothing to collect.
- `stdout`: lines of the script's output such as `step=100 train/loss=0.31 valid/error_rate=0.05`
  (`key=value` or `key: value` tokens, one of them `step`); or, with `pattern`, a regular
  expression with named groups `name` and `value` (and optionally `step`) matched across each line,
  the step coming from the group, else from a `step=N` token of the line, else the last step seen.
- `tensorboard`: scalars from the event files the script writes under `$HPO_OUT_DIR` (or the
  spec's `dir` below it), read with TensorBoard's own event-file loader; each scalar's tag is the
  metric's name.

Collectors only read what the trial wrote (never run it), from the supervisor, after the trial's
own process wrote it. Standard library only, but for TensorBoard's loader, imported when used."""

from __future__ import annotations

import glob
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from hpo.collector_spec import CollectorSpec
from hpo.trainer.reporters import format_value

MAX_LINE = 4096  # longer lines are cut: a pattern is spec text, run on the trial's output
_PAIR = re.compile(
    r"([A-Za-z_][A-Za-z0-9_./\-]*)\s*[=:]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|[-+]?inf(?:inity)?)"
)
_STEP_NAMES = ("step", "global_step", "iteration", "iter")


class Collector(Protocol):
    def collect(self) -> int:
        """Appends the points found since the last call to metrics.jsonl; answers how many."""
        ...


class CollectorUnavailable(RuntimeError):
    """This worker cannot run the collector a study asks for (a missing optional package)."""


def require(spec: CollectorSpec) -> None:
    """Raises CollectorUnavailable when this worker cannot run the collector (before any start)."""
    if spec.collector == "tensorboard":
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise CollectorUnavailable(
                'trainer.metrics "tensorboard" needs TensorBoard on the workers: pip install "hpo[tensorboard]"'
            ) from None


def collector_for(spec: CollectorSpec, out_dir: Path, stdout_path: Path, metrics_path: Path) -> Collector | None:
    """The collector for a trial's rank 0 (None for `file`: the script writes the file itself)."""
    if spec.collector == "stdout":
        return StdoutCollector(stdout_path, metrics_path, spec.pattern)
    if spec.collector == "tensorboard":
        return TensorBoardCollector(out_dir / (spec.dir or "."), metrics_path)
    return None


class _PointWriter:
    def __init__(self, metrics_path: Path) -> None:
        self.path = metrics_path

    def write(self, points: list[tuple[int, str, float]]) -> int:
        if points:
            lines = "".join(
                f'{{"step": {step}, "name": {_quoted(name)}, "value": {format_value(value)}}}\n'
                for step, name, value in points
            )
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(lines)
        return len(points)


def _quoted(name: str) -> str:
    return json.dumps(name)


class StdoutCollector:
    """Points from the script's output lines (stdout.log, which the runner fills)."""

    def __init__(self, stdout_path: Path, metrics_path: Path, pattern: str | None = None) -> None:
        self.source, self.out = stdout_path, _PointWriter(metrics_path)
        self.pattern = re.compile(pattern) if pattern else None
        self.offset = 0
        self.last_step: int | None = None

    def collect(self) -> int:
        points: list[tuple[int, str, float]] = []
        for line in self._new_lines():
            points.extend(self.parse(line[:MAX_LINE]))
        return self.out.write(points)

    def _new_lines(self) -> Iterator[str]:
        try:
            with self.source.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read(4 * 1024 * 1024)
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return  # a line still being written
        self.offset += end + 1
        yield from data[: end + 1].decode("utf-8", "replace").splitlines()

    def parse(self, line: str) -> list[tuple[int, str, float]]:
        """The points of one line; a line with no step (and none seen before) gives none."""
        pairs = {name: value for name, value in _PAIR.findall(line)}
        step_token = next((pairs[n] for n in _STEP_NAMES if n in pairs), None)
        if self.pattern is None:
            step = _as_step(step_token)
            if step is None:
                return []
            self.last_step = step
            return [(step, name, float(value)) for name, value in pairs.items() if name not in _STEP_NAMES]
        found = []
        for match in self.pattern.finditer(line):
            groups = match.groupdict()
            step = _as_step(groups.get("step")) if groups.get("step") else _as_step(step_token)
            step = self.last_step if step is None else step
            value = _as_float(groups.get("value"))
            if step is None or value is None or not groups.get("name") or groups["name"] in _STEP_NAMES:
                continue
            self.last_step = step
            found.append((step, str(groups["name"]), value))
        return found


def _as_step(text: str | None) -> int | None:
    value = _as_float(text)
    if value is None or not math.isfinite(value) or value < 0 or value != int(value) or value >= 2**31:
        return None
    return int(value)


def _as_float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class TensorBoardCollector:
    """Scalars from `events.out.tfevents.*` files below `folder`, read incrementally with
    TensorBoard's `EventFileLoader` (one per file: a resumed run writes a new file)."""

    def __init__(self, folder: Path, metrics_path: Path) -> None:
        self.folder, self.out = folder, _PointWriter(metrics_path)
        self.loaders: dict[str, Any] = {}

    def collect(self) -> int:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        pattern = os.path.join(glob.escape(str(self.folder)), "**", "events.out.tfevents.*")
        for path in sorted(glob.glob(pattern, recursive=True)):
            if path not in self.loaders:
                self.loaders[path] = EventFileLoader(path)
        points: list[tuple[int, str, float]] = []
        for loader in self.loaders.values():
            for event in loader.Load():
                points.extend(_scalars(event))
        return self.out.write(points)


def _scalars(event: Any) -> Iterator[tuple[int, str, float]]:
    if not event.HasField("summary") or not 0 <= event.step < 2**31:
        return
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            yield int(event.step), value.tag, float(value.simple_value)
        elif kind == "tensor" and value.metadata.plugin_data.plugin_name == "scalars":
            from tensorboard.util import tensor_util

            array = tensor_util.make_ndarray(value.tensor)
            if array.size == 1:
                yield int(event.step), value.tag, float(array.reshape(()))
