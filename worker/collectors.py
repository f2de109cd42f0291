"""Metrics from what a script already writes (`trainer.metrics`, docs/scripts.md).

A command's metric points reach hpo through `$HPO_OUT_DIR/metrics.jsonl`, which rank 0's runner
tails. A collector finds more points in what an unchanged script writes anyway, the way Katib's
stdout and TensorBoard collectors do, and hands them to the runner, which accepts them with the
file's (worker/command.py):

- `file` (the default): the script writes `metrics.jsonl` itself; nothing to collect.
- `stdout`: lines of the script's output such as `step=100 train/loss=0.31 valid/error_rate=0.05`
  (`key=value` or `key: value` tokens, one of them `step`); or, with `pattern`, a regular
  expression with named groups `name` and `value` (and optionally `step`) matched across each line,
  the step coming from the group, else from a `step=N` token of the line, else the last step seen.
- `tensorboard`: scalars from the event files the script writes under `$HPO_OUT_DIR` (or the
  spec's `dir` below it), read with TensorBoard's own event-file loader; each scalar's tag is the
  metric's name.

Collectors only read what the trial wrote (never run it), and never write: the stdout collector
reads the worker's own `stdout.log`, the TensorBoard collector reads event files through the
attempt's `TrialTree` (worker/trial_tree.py: no link followed, only regular files). Standard
library only, but for TensorBoard's loader, imported when used."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hpo.collector_spec import CollectorSpec

from .trial_tree import TrialTree

MAX_LINE = 4096  # longer lines are cut: a pattern is spec text, run on the trial's output
_PAIR = re.compile(
    r"([A-Za-z_][A-Za-z0-9_./\-]*)\s*[=:]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|[-+]?inf(?:inity)?)"
)
_STEP_NAMES = ("step", "global_step", "iteration", "iter")


Point = tuple[int, str, float]
MAX_EVENT_FILES = 256  # event files followed per attempt (each holds a descriptor)


class Collector(Protocol):
    def collect(self) -> list[Point]:
        """The points found since the last call."""
        ...

    def close(self) -> None:
        """Lets go of what it holds open (the supervisor's process outlives the trial)."""
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


def collector_for(spec: CollectorSpec, tree: Callable[[], TrialTree], stdout_path: Path) -> Collector | None:
    """The collector for a trial's rank 0 (None for `file`: the script writes the file itself).
    `tree` answers the attempt's open folder once the run has opened it."""
    if spec.collector == "stdout":
        return StdoutCollector(stdout_path, spec.pattern)
    if spec.collector == "tensorboard":
        return TensorBoardCollector(tree, spec.dir or ".")
    return None


class StdoutCollector:
    """Points from the script's output lines (stdout.log, which the runner fills)."""

    def __init__(self, stdout_path: Path, pattern: str | None = None) -> None:
        self.source = stdout_path
        self.pattern = re.compile(pattern) if pattern else None
        self.offset = 0
        self.last_step: int | None = None

    def collect(self) -> list[Point]:
        points: list[Point] = []
        for line in self._new_lines():
            points.extend(self.parse(line[:MAX_LINE]))
        return points

    def close(self) -> None:
        return None

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

    def parse(self, line: str) -> list[Point]:
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
    """Scalars from `events.out.tfevents.*` files below `folder` of the attempt, read incrementally
    with TensorBoard's `EventFileLoader` (one per file: a resumed run writes a new file). Each file
    is opened once through the attempt's `TrialTree`; the loader reads that open file through
    `/proc/self/fd`, so a name the trial swaps for a link later changes nothing."""

    def __init__(self, tree: TrialTree | Callable[[], TrialTree], folder: str = ".") -> None:
        self.tree = tree if callable(tree) else (lambda: tree)
        self.folder = folder
        self.loaders: dict[str, tuple[BinaryIO, Any]] = {}

    def collect(self) -> list[Point]:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        tree = self.tree()
        for path in tree.walk_files(self.folder):
            if path in self.loaders or not os.path.basename(path).startswith("events.out.tfevents."):
                continue
            if len(self.loaders) >= MAX_EVENT_FILES:
                break
            handle = tree.open_file(path)
            if handle is not None:
                self.loaders[path] = (handle, EventFileLoader(f"/proc/self/fd/{handle.fileno()}"))
        points: list[Point] = []
        for _handle, loader in self.loaders.values():
            for event in loader.Load():
                points.extend(_scalars(event))
        return points

    def close(self) -> None:
        for handle, _loader in self.loaders.values():
            handle.close()
        self.loaders.clear()


def _scalars(event: Any) -> Iterator[Point]:
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
