"""A stand-in with hpo.trainer's contract (`train(config, out_dir, reporter) -> RunResult`) for
fault-injection tests that need user code to misbehave on cue: `params.fail_at_step` raises,
`params.diverge_at_step` answers infeasible, `params.step_seconds` sets the pace. Its "loss" is a
pure function of (seed, step), so a resumed run must reproduce an uninterrupted one exactly."""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


@dataclass
class RunResult:
    status: str
    reason: str = ""
    step: int = 0


def _loss(seed: int, step: int) -> float:
    return 2.0 * math.exp(-step / 50) + random.Random(seed * 100_003 + step).random() * 0.01


def train(config: dict[str, Any], out_dir: Path, reporter: Any) -> RunResult:
    params, trainer = config["params"], config["trainer"]
    if "bad" in params:
        raise ConfigError("unknown parameter 'bad'")
    steps, every = int(trainer.get("max_train_steps", 100)), int(trainer.get("eval_every_steps", 10))
    if os.environ.get("RANK", "0") != "0":
        return RunResult("completed", step=steps)  # only rank 0 writes; this stand-in does no collectives
    out_dir.mkdir(parents=True, exist_ok=True)
    start = _resume_step(trainer.get("resume_from"), out_dir)
    with (out_dir / "metrics.jsonl").open("a") as log:
        for step in range(start + 1, steps + 1):
            result = _step(config, out_dir, reporter, log, step, every)
            if result is not None:
                return result
    return RunResult("completed", step=steps)


def _step(config: dict[str, Any], out_dir: Path, reporter: Any, log: Any, step: int, every: int) -> RunResult | None:
    params, seed = config["params"], int(config.get("seed", 0))
    time.sleep(float(params.get("step_seconds", 0.0)))
    if params.get("fail_at_step") == step:
        raise RuntimeError(f"user code failed at step {step}")
    values = {"train/loss": _loss(seed, step)}
    if params.get("diverge_at_step") == step:
        values["train/loss"] = float("nan")
    if step % every == 0:
        values["valid/error_rate"] = _loss(seed + 1, step)
    for name, value in values.items():
        log.write(json.dumps({"step": step, "name": name, "value": value}) + "\n")
    log.flush()
    if reporter is not None:
        reporter.metrics(step, values)
    if math.isnan(values["train/loss"]):
        return RunResult("infeasible", "loss is NaN", step)
    if step % every == 0:
        _save(out_dir, step, reporter, values["valid/error_rate"])
    if reporter is not None and reporter.should_stop():
        _save(out_dir, step, reporter, None)
        return RunResult("stopped", "stop requested", step)
    return None


def _save(out_dir: Path, step: int, reporter: Any, objective: float | None) -> None:
    path = out_dir / "checkpoints" / f"step-{step:06d}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"step": step}))
    if reporter is not None:
        reporter.checkpoint(step, path, objective)


def _resume_step(resume_from: str | None, out_dir: Path) -> int:
    candidates = sorted((out_dir / "checkpoints").glob("step-*.json"))
    source = Path(resume_from) if resume_from else (candidates[-1] if candidates else None)
    return int(json.loads(source.read_text())["step"]) if source else 0
