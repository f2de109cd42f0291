"""Helpers for the framework callbacks' tests: run a script the way the worker does (a process of
its own with `HPO_CONFIG` and `HPO_OUT_DIR`), read back the files it wrote, stop it with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpo.worker.command import list_checkpoints, read_result
from hpo.worker.reporter import MetricsTail

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "integrations"


def trial_env(tmp_path: Path, name: str, resume_from: Path | None = None, **trainer: Any) -> dict[str, str]:
    """The environment of one attempt: its config file and its own, new output folder."""
    out = tmp_path / name
    out.mkdir()
    config = {
        "params": {},
        "seed": 3,
        "trainer": {"max_train_steps": 90, "eval_every_steps": 30, **trainer},
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "resume_from": str(resume_from) if resume_from else None,
    }
    (out / "hpo-config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPO_", "RANK", "WORLD_SIZE"))}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(HPO_CONFIG=str(out / "hpo-config.json"), HPO_OUT_DIR=str(out), PYTHONPATH=path)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def start(script: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    out = Path(env["HPO_OUT_DIR"])
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=EXAMPLES,
        env=env,
        stdout=(out / "stdout.log").open("w"),
        stderr=(out / "stderr.log").open("w"),
        text=True,
    )


def run(script: str, args: list[str], env: dict[str, str], timeout: float = 240) -> Path:
    """Runs the script to its end; answers its output folder. A failure shows its stderr."""
    proc = start(script, args, env)
    returncode = proc.wait(timeout=timeout)
    out = Path(env["HPO_OUT_DIR"])
    assert returncode == 0, (out / "stderr.log").read_text()[-4000:]
    return out


def points(out: Path, name: str) -> list[tuple[int, float]]:
    found, _ = MetricsTail(out / "metrics.jsonl").read()
    return [(p["step"], p["value"]) for p in found if p["name"] == name]


def values(out: Path, name: str) -> list[float]:
    return [value for _, value in points(out, name)]


def steps(out: Path, name: str) -> list[int]:
    return [step for step, _ in points(out, name)]


def checkpoints(out: Path) -> dict[int, Path]:
    """The complete checkpoints, as the worker lists them; nothing half-written is left beside."""
    folder = out / "checkpoints"
    leftovers = [p.name for p in folder.iterdir() if not p.name.startswith("step-")] if folder.exists() else []
    assert leftovers == [], f"temporary files left: {leftovers}"
    return list_checkpoints(folder)


def result(out: Path) -> tuple[str, str] | None:
    return read_result(out / "result.json")


def stop_after(proc: subprocess.Popen[str], out: Path, name: str, step: int, timeout: float = 180) -> int:
    """Sends SIGTERM once the script reported `name` at `step` or later; answers its exit status."""
    deadline = time.monotonic() + timeout
    while not any(s >= step for s in steps(out, name)):
        assert proc.poll() is None, (out / "stderr.log").read_text()[-4000:]
        assert time.monotonic() < deadline, f"no {name} at step {step} within {timeout} s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120)
