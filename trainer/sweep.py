"""`hpo batch-size-sweep`: the largest batch size worth using on this hardware.

Playbook (002), "Choosing the batch size": the batch size governs training speed, not validation
performance (given retuned hyperparameters), so pick one that the hardware runs efficiently.
Doubling the batch size should roughly double throughput while the accelerator has room; once
throughput stops growing, a larger batch only costs more steps' worth of tuning. This runs short
runs at powers of two until memory runs out or throughput grows by less than `min_gain`, and names
the largest batch size that still bought throughput."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import RunResult


@dataclass(frozen=True)
class SweepPoint:
    batch_size: int
    examples_per_second: float | None
    status: str
    reason: str | None = None


@dataclass(frozen=True)
class SweepResult:
    points: tuple[SweepPoint, ...]
    best_batch_size: int | None
    stopped_because: str


def sweep_config(config: Mapping[str, Any], batch_size: int, steps: int) -> dict[str, Any]:
    """The short run for one batch size: `steps` steps, one evaluation at the end, no sanity checks;
    throughput is measured over the second half of the steps (the first half warms up)."""
    run = copy.deepcopy(dict(config))
    run["params"] = {**dict(run.get("params") or {}), "batch_size": batch_size}
    trainer = {k: v for k, v in dict(run.get("trainer") or {}).items() if k not in ("resume_from", "batch_size")}
    trainer.update(
        max_train_steps=steps,
        eval_every_steps=steps,
        log_every_steps=max(1, steps // 2),
        sanity_checks=False,
        overfit_one_batch=False,
        keep_best_checkpoints=1,
        eval_batch_size=None,
    )
    run["trainer"] = trainer
    return run


def batch_size_sweep(
    config: Mapping[str, Any],
    run: Callable[[dict[str, Any], Path], RunResult],
    *,
    start: int = 8,
    max_batch_size: int = 65536,
    steps: int = 20,
    min_gain: float = 1.1,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> SweepResult:
    """Doubles the batch size from `start`; `run(config, out_dir)` trains one short run."""
    points: list[SweepPoint] = []
    best: SweepPoint | None = None
    batch, reason = start, f"reached --max-batch-size {max_batch_size}"
    while batch <= max_batch_size:
        with tempfile.TemporaryDirectory(prefix=f"hpo-sweep-{batch}-") as tmp:
            result = run(sweep_config(config, batch, steps), Path(tmp))
        point = SweepPoint(batch, result.examples_per_second, result.status, result.reason)
        points.append(point)
        if on_point is not None:
            on_point(point)
        if result.status != "completed" or point.examples_per_second is None:
            oom = result.status == "infeasible" and "out of memory" in (result.reason or "")
            reason = "out of memory" if oom else f"the run at batch size {batch} ended {result.status}"
            break
        if (
            best is not None
            and best.examples_per_second
            and point.examples_per_second < min_gain * best.examples_per_second
        ):
            reason = f"throughput grew less than {min_gain - 1:.0%} from {best.batch_size} to {batch}"
            break
        best = point
        batch *= 2
    return SweepResult(tuple(points), best.batch_size if best else None, reason)
