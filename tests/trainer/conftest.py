"""Helpers for the trainer suite: small configs (a tiny synthetic task, so every run takes seconds on
two CPU cores), metrics.jsonl readers and a way to start `hpo train` as a real process."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# A tiny teacher task: 4 classes in 8 features, 512 training and 256 validation examples.
SMALL_DATA: dict[str, Any] = {
    "num_features": 8,
    "num_classes": 4,
    "train_examples": 512,
    "valid_examples": 256,
    "teacher_width": 16,
}
TIMING_METRICS = frozenset({"train/examples_per_second", "train/data_wait_fraction"})


def make_config(
    params: dict[str, Any] | None = None, trainer: dict[str, Any] | None = None, seed: int = 0, **top: Any
) -> dict[str, Any]:
    """A small synthetic_mlp run (adam, batch 32, width 32, 20 steps, evaluation every 10)."""
    config: dict[str, Any] = {
        "params": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 32, "width": 32, **(params or {})},
        "trainer": {
            "workload": "synthetic_mlp",
            "workload_options": copy.deepcopy(SMALL_DATA),
            "max_train_steps": 20,
            "eval_every_steps": 10,
            **(trainer or {}),
        },
        "seed": seed,
    }
    config.update(top)
    return config


def _number(value: Any) -> float:
    return float(value)  # "NaN" / "Infinity" / "-Infinity" parse as floats too


def read_metrics(out_dir: Path) -> list[tuple[int, str, float]]:
    """Every point of `out_dir/metrics.jsonl` in file order, as (step, name, value)."""
    points = []
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        raw = json.loads(line)
        points.append((int(raw["step"]), str(raw["name"]), _number(raw["value"])))
    return points


def series(points: list[tuple[int, str, float]], name: str) -> dict[int, float]:
    """{step: value} of one metric; fails on a duplicate step."""
    out: dict[int, float] = {}
    for step, metric, value in points:
        if metric == name:
            assert step not in out, f"duplicate point {name} at step {step}"
            out[step] = value
    return out


def same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# The installed `hpo` console script, the command a user types. (Not `python -m hpo.cli`: run as
# `__main__`, that module's CliError is another class than the one the subcommands raise.)
HPO = str(Path(sys.executable).parent / "hpo")


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def start_train(config: dict[str, Any], out_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """`hpo train --config FILE --out DIR` as a real process (its own session, so
    signals go to it alone)."""
    config_file = out_dir.with_name(out_dir.name + "-config.json")
    config_file.write_text(json.dumps(config))
    return subprocess.Popen(
        [HPO, "train", "--config", str(config_file), "--out", str(out_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=out_dir.parent,
        start_new_session=True,
    )


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen[str] | None = None
) -> None:
    """Polls `predicate` every 5 ms until it holds; fails after `timeout` s or if `process` exits."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"process exited ({process.returncode}) before {what}\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; any still running at the end are killed (by their own pid)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.fixture
def restore_signals() -> Iterator[None]:
    """`run_local(..., nproc=1)` and `hpo train` in this process install SIGINT / SIGTERM handlers;
    put pytest's back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
