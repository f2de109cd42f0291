"""The worker with the real trainer: a study of one-process trials runs several at once with every
metric and checkpoint reported; a learning rate far too high ends `infeasible`; an unknown workload
fails as `config`; a 2-process trial runs as DDP under Ray Train (gloo); and `hpo demo` runs a
whole (small) study end to end in its own process."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.settings import Settings
from hpo.worker.command import worker_dir
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import ON_POSTGRES_ONLY, LiveServer
from tests.worker.conftest import API, REPO, TESTS_ALLOWED, create_study, metric_steps, study_done, trials

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DEMO = json.loads((REPO / "examples" / "demo-study.json").read_text())
DDP = json.loads((REPO / "examples" / "ddp-cpu.json").read_text())
STEPS, EVERY = 40, 20


def small(spec: dict[str, Any], name: str, num_trials: int = 1, **trainer: Any) -> dict[str, Any]:
    """An example spec cut down to `num_trials` per arm and STEPS steps."""
    spec = copy.deepcopy(spec)
    spec.update(name=name, num_trials=num_trials)
    spec["trainer"].update(max_train_steps=STEPS, eval_every_steps=EVERY, **trainer)
    return spec


@pytest.fixture
def env(ray_address: str, database_url: str, tmp_path: Path) -> Any:
    settings = Settings(
        database_url=database_url,
        artifact_root=tmp_path / "artifacts",
        lease_seconds=30,
        execution_policy=TESTS_ALLOWED,
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, settings


def run(server: LiveServer, settings: Settings, until: Any) -> Worker:
    options = WorkerOptions(
        unconfined=True,
        server_url=server.url,
        artifact_root=settings.artifact_root,
        idle_poll_seconds=0.2,
        policy=TESTS_ALLOWED,
    )
    worker = Worker(options)
    worker.run(until=until)
    return worker


@ON_POSTGRES_ONLY
def test_study_runs_trials_side_by_side_and_reports_everything(env: Any) -> None:
    server, http, settings = env
    study = create_study(http, small(DEMO, "real", num_trials=2))
    worker = run(server, settings, study_done(http, study["id"]))
    assert worker.stats.max_running == 2, "two 1-CPU trials at once on the 2-CPU Ray instance"
    for trial in trials(http, study["id"]):
        assert trial["status"] == "completed", trial
        assert trial["objective_value"] is not None and trial["best_step"] in range(EVERY, STEPS + 1, EVERY)
        names = {p["name"] for p in http.get(f"{API}/trials/{trial['id']}/metrics").json()["items"]}
        assert {
            "train/loss",
            "train/grad_norm",
            "train/learning_rate",
            "train/examples_per_second",
            "train/data_wait_fraction",
            "valid/loss",
            "valid/error_rate",
        } <= names
        assert [s for s, _ in metric_steps(http, trial["id"], "valid/error_rate")] == list(
            range(EVERY, STEPS + 1, EVERY)
        )
        checkpoints = http.get(f"{API}/trials/{trial['id']}/checkpoints").json()
        assert checkpoints and all(c["uri"].startswith(f"trials/{trial['id']}/attempt-1/") for c in checkpoints)
        assert all((settings.artifact_root / c["uri"]).exists() for c in checkpoints[:1])
    # Each trial's claim-to-first-step latency is recorded and ordered; how fast it is belongs to
    # bench/worker_latency.py (a wall-clock bound here failed under CI's parallel load).
    assert sorted(trial_id for trial_id, _, _ in worker.stats.latencies) == sorted(
        trial["id"] for trial in trials(http, study["id"])
    )
    for _, started, first_step in worker.stats.latencies:
        assert started is not None and first_step is not None and 0 <= started <= first_step


@ON_POSTGRES_ONLY
def test_diverging_trial_is_infeasible_and_unknown_workload_is_a_config_failure(env: Any) -> None:
    server, http, settings = env
    diverging = small(DEMO, "diverging")
    # Nesterov momentum at lr 1e6 overflows within a few steps (Adam's update is bounded by the
    # rate itself, so it can stay finite, just useless).
    kept = [
        h for h in diverging["hyperparameters"] if h["name"] != "learning_rate" and "adam" not in str(h.get("when"))
    ]
    diverging["hyperparameters"] = [*kept, {"name": "learning_rate", "role": "fixed", "value": 1e6}]
    diverging["hyperparameters"][0]["values"] = ["nesterov"]
    diverging_study = create_study(http, diverging)
    # Allowed on server and worker, but no such module: the trainer's import fails as `config`.
    broken_study = create_study(http, small(DEMO, "broken", workload="tests.no_such_module:Missing"))
    run(server, settings, lambda: all(study_done(http, s["id"])() for s in (diverging_study, broken_study)))
    for trial in trials(http, diverging_study["id"]):
        assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("infeasible", "infeasible", 1), trial
    for trial in trials(http, broken_study["id"]):
        assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("failed", "config", 1), trial


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_ddp_trial_runs_under_ray_train(env: Any) -> None:
    server, http, settings = env
    spec = small(DDP, "ddp")
    spec["hyperparameters"][0]["values"] = [0.0]  # one arm: one DDP run of 2 processes
    study = create_study(http, spec)
    worker = run(server, settings, study_done(http, study["id"]))
    (trial,) = trials(http, study["id"])
    assert trial["status"] == "completed", trial
    assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, STEPS + 1))
    attempt = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1"
    # Ray Train's records are the worker's, beside the trial's folder (docs/security.md)
    assert (attempt / "metrics.jsonl").exists() and (worker_dir(attempt) / "ray-train").is_dir()
    assert not (attempt / "ray-train").exists()
    assert worker.stats.claimed == 1


def test_demo_runs_a_study_end_to_end(tmp_path: Path) -> None:
    spec = small(DEMO, "demo-test", num_trials=2)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    command = [
        sys.executable,
        "-m",
        "hpo.cli",
        "demo",
        "--workdir",
        str(tmp_path / "demo"),
        "--spec",
        str(tmp_path / "spec.json"),
        "--num-cpus",
        "2",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=170, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "best valid/error_rate (min) per optimizer:" in out, out
    assert "optimizer=adam" in out and "optimizer=nesterov" in out
    assert "study 1 completed" in out and "where to look next:" in out
    assert (tmp_path / "demo" / "hpo.db").exists() and (tmp_path / "demo" / "artifacts" / "trials").is_dir()
