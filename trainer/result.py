"""`RunResult`: how one call to `train()` ended (no torch import)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("completed", "infeasible", "error", "stopped")


@dataclass(frozen=True)
class RunResult:
    """The outcome of `train()`.

    - `status`: `completed` (reached `max_train_steps`), `infeasible` (non-finite loss or gradient,
      or out of memory: a property of the hyperparameters, never retried), `error` (any other
      exception; `reason` holds the exception and its traceback), `stopped` (the reporter asked to
      stop; a checkpoint at `step` was written, so calling `train()` again resumes).
    - `step`: the last step reached (the failing step for `infeasible`).
    - `best_step` / `best_value`: the best finite value of the objective metric over the
      evaluations so far and where it happened (retrospective checkpoint selection), None before the
      first evaluation.
    - `checkpoint_dir`: `out_dir/checkpoints`; `best_checkpoint`: the kept checkpoint at
      `best_step`, when one exists.
    - `examples_per_second`: training throughput (all ranks together) over the last logging window,
      the steps since the log line before the last (`log_every_steps`); None if no step ran.
    - `warnings`: sanity-check findings (initial loss far from chance, could not overfit a batch).
    - `final_metrics`: the metrics of the last evaluation."""

    status: str
    reason: str | None = None
    step: int = 0
    best_step: int | None = None
    best_value: float | None = None
    checkpoint_dir: str | None = None
    best_checkpoint: str | None = None
    examples_per_second: float | None = None
    warnings: tuple[str, ...] = ()
    final_metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (non-finite floats as the strings "NaN", "Infinity", "-Infinity")."""
        raw = asdict(self)
        raw["warnings"] = list(self.warnings)
        raw["final_metrics"] = {name: json_float(value) for name, value in self.final_metrics.items()}
        raw["best_value"] = None if self.best_value is None else json_float(self.best_value)
        return raw

    def write(self, path: Path) -> None:
        """Writes `to_json()` atomically."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> RunResult:
        raw = json.loads(path.read_text())
        raw["warnings"] = tuple(raw.get("warnings", ()))
        raw["final_metrics"] = {k: float(v) for k, v in raw.get("final_metrics", {}).items()}
        if raw.get("best_value") is not None:
            raw["best_value"] = float(raw["best_value"])
        return cls(**raw)


def json_float(value: float) -> float | str:
    """A float as JSON allows it: finite values as numbers, others as "NaN" / "Infinity" / "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
