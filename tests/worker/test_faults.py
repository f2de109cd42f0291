"""Faults with real processes: `hpo worker` runs as a subprocess that joins the session's Ray
instance, and is SIGKILLed or SIGTERMed mid-trial. Each study holds two identical manual trials
(same params, same seed); the interrupted one must end with exactly the history and result of the
uninterrupted twin: no gap, no duplicate, same values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import (
    API,
    FAKE_WORKLOAD,
    REPO,
    TESTS_ALLOWED,
    create_study,
    fault_server,
    metric_steps,
    study_done,
    trials,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Deterministic metrics (timing metrics such as examples_per_second differ between any two runs).
COMPARED = ("train/loss", "valid/error_rate", "valid/loss", "train/grad_norm", "train/learning_rate")


@pytest.fixture
def server(ray_address: str, tmp_path: Path) -> Iterator[tuple[LiveServer, httpx.Client, Settings]]:
    with fault_server(tmp_path, TESTS_ALLOWED) as running:
        yield running


def twin_study(trainer: dict[str, Any], params: dict[str, Any], hyperparameters: list[dict[str, Any]]) -> dict:
    return {
        "name": "twins",
        "algorithm": "manual",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "hyperparameters": hyperparameters,
        "trials": [{"params": params, "seed": 7}, {"params": params, "seed": 7}],
        "trainer": trainer,
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }


def fake_twins() -> tuple[dict[str, Any], str, int, int]:
    spec = twin_study(
        {"workload": FAKE_WORKLOAD, "max_train_steps": 150, "eval_every_steps": 10},
        {"learning_rate": 0.1},
        [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0, "scale": "log"},
            {"name": "step_seconds", "role": "fixed", "value": 0.06},
        ],
    )
    return spec, "tests.worker.fake_trainer:train", 150, 10


def real_twins() -> tuple[dict[str, Any], str, int, int]:
    """The real trainer, with dropout so that the resumed run must restore every RNG state. Long
    enough (5,000 steps, several seconds even on a fast quiet machine) that a stop sent once the
    run is seen mid-run arrives before it ends: at 1,500 steps a quiet machine finished first."""
    spec = twin_study(
        {"workload": "synthetic_mlp", "max_train_steps": 5000, "eval_every_steps": 100, "keep_best_checkpoints": 2},
        {"learning_rate": 0.003},
        [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1e-1, "scale": "log"},
            {"name": "optimizer", "role": "fixed", "value": "adam"},
            {"name": "dropout", "role": "fixed", "value": 0.1},
        ],
    )
    return spec, "hpo.trainer:train", 5000, 100


def start_worker(url: str, ray_address: str, settings: Settings, trainer: str) -> subprocess.Popen[bytes]:
    """`hpo worker` as its own process, one trial at a time, joining the session's Ray instance."""
    command = [
        sys.executable,
        "-m",
        "hpo.cli",
        "worker",
        "--unconfined",
        "--server",
        url,
        "--ray-address",
        ray_address,
        "--max-trials",
        "1",
        "--trainer",
        trainer,
        "--exit-when-idle",
        "60",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "HPO_ARTIFACT_ROOT": str(settings.artifact_root), "HPO_ALLOWED_WORKLOADS": "tests.*"}
    return subprocess.Popen(command, cwd=REPO, env=env)


def run_to_the_end(url: str, settings: Settings, http: httpx.Client, study_id: int, trainer: str) -> None:
    """Another worker (in this process) finishes the study."""
    options = WorkerOptions(
        unconfined=True,
        server_url=url,
        artifact_root=settings.artifact_root,
        trainer=trainer,
        idle_poll_seconds=0.2,
        exit_when_idle_seconds=60,
        policy=TESTS_ALLOWED,
    )
    Worker(options).run(until=study_done(http, study_id))


def mid_run(http: httpx.Client, trial_id: int, min_step: int) -> bool:
    """A checkpoint is recorded at min_step or later, and the run went on past it."""
    checkpoints = http.get(f"{API}/trials/{trial_id}/checkpoints").json()
    newest = max((c["step"] for c in checkpoints), default=-1)
    steps = [s for s, _ in metric_steps(http, trial_id, "train/loss")]
    return newest >= min_step and bool(steps) and max(steps) > newest


def assert_same_as_twin(http: httpx.Client, interrupted: int, twin: int, steps: int) -> None:
    names = {p["name"] for p in http.get(f"{API}/trials/{twin}/metrics").json()["items"]}
    for name in sorted(names & set(COMPARED)):
        history = metric_steps(http, interrupted, name)
        assert [s for s, _ in history] == sorted({s for s, _ in history}), f"{name}: duplicate steps"
        assert history == metric_steps(http, twin, name), f"{name} differs from the uninterrupted twin"
    loss_steps = [s for s, _ in metric_steps(http, interrupted, "train/loss")]
    assert loss_steps[0] <= 1 and loss_steps[-1] == steps and len(loss_steps) == loss_steps[-1] - loss_steps[0] + 1
    a, b = (http.get(f"{API}/trials/{t}").json() for t in (interrupted, twin))
    assert (a["status"], b["status"]) == ("completed", "completed")
    assert (a["objective_value"], a["best_step"]) == (b["objective_value"], b["best_step"])


def first_step_of(settings: Settings, trial_id: int, attempt: int) -> int:
    log = settings.artifact_root / "trials" / str(trial_id) / f"attempt-{attempt}" / "metrics.jsonl"
    return int(json.loads(log.read_text().splitlines()[0])["step"])


@pytest.mark.parametrize("twins", [fake_twins, real_twins], ids=["fake-trainer", "real-trainer"])
def test_sigkilled_worker_lease_lapses_and_another_worker_resumes(server: Any, ray_address: str, twins: Any) -> None:
    live, http, settings = server
    spec, trainer, steps, every = twins()
    study = create_study(http, spec)
    victim, twin = (t["id"] for t in trials(http, study["id"]))
    worker = start_worker(live.url, ray_address, settings, trainer)
    try:
        wait_until(lambda: mid_run(http, victim, 2 * every), 90, "the first trial to be mid-run")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        orphan_log = settings.artifact_root / "trials" / str(victim) / "attempt-1" / "metrics.jsonl"
        time.sleep(2)
        size_after_kill = orphan_log.stat().st_size
        run_to_the_end(live.url, settings, http, study["id"], trainer)
    finally:
        worker.kill()
    assert orphan_log.stat().st_size == size_after_kill, "the killed worker's trial process went on training"
    victim_trial = http.get(f"{API}/trials/{victim}").json()
    assert victim_trial["attempt"] == 2, "the lapsed lease was claimed again"
    assert first_step_of(settings, victim, 2) > 1, "attempt 2 resumed from a checkpoint"
    assert_same_as_twin(http, victim, twin, steps)


@pytest.mark.parametrize("twins", [fake_twins, real_twins], ids=["fake-trainer", "real-trainer"])
def test_sigterm_checkpoints_gives_the_trial_back_and_exits(server: Any, ray_address: str, twins: Any) -> None:
    live, http, settings = server
    spec, trainer, steps, every = twins()
    study = create_study(http, spec)
    victim, twin = (t["id"] for t in trials(http, study["id"]))
    worker = start_worker(live.url, ray_address, settings, trainer)
    try:
        wait_until(lambda: mid_run(http, victim, every), 90, "the first trial to be mid-run")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        worker.kill()
    given_back = http.get(f"{API}/trials/{victim}").json()
    assert (given_back["status"], given_back["attempt"]) == ("pending", 1)
    last_step = max(s for s, _ in metric_steps(http, victim, "train/loss"))
    newest = max(c["step"] for c in http.get(f"{API}/trials/{victim}/checkpoints").json())
    assert newest == last_step, "the run checkpointed where it stopped"
    run_to_the_end(live.url, settings, http, study["id"], trainer)
    assert first_step_of(settings, victim, 2) == newest + 1
    assert_same_as_twin(http, victim, twin, steps)
