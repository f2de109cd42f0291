"""Who may run code, on a real worker (the session's Ray instance) against a real server with
tokens: a study naming `os:system` ends as `config` naming --allow-workload and the command never
runs, while the same study on a worker whose operator allows `os` does run it (so the test could
fail); trial processes carry a per-trial token, never the worker's, and report with it."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.settings import Settings
from hpo.worker import cli as worker_cli
from hpo.worker.client import ServerClient
from hpo.worker.loop import Worker, WorkerOptions, execution_refusal
from hpo.worker.runs import JobSettings, build_job
from tests.conftest import LiveServer
from tests.worker.conftest import API, SilentClient, study_done, trials

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def system_study(name: str, marker: Path) -> dict[str, Any]:
    return {
        "name": name,
        "hyperparameters": [{"name": "x", "role": "fixed", "value": 1}],
        "trainer": {"workload": "os:system", "workload_options": {"command": f"env > {marker}"}},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }


def tiny_study() -> dict[str, Any]:
    return {
        "name": "tiny",
        "hyperparameters": [{"name": "learning_rate", "role": "fixed", "value": 0.01}],
        "trainer": {"workload": "synthetic_mlp", "max_train_steps": 5, "eval_every_steps": 5},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_os_system_never_runs_unless_the_workers_operator_allows_it(
    ray_address: str, settings: Settings, tmp_path: Path
) -> None:
    db = Database(settings.database_url)
    db.upgrade()
    _, writer = auth.create_token(db, "write")
    _, worker_token = auth.create_token(db, "worker")
    db.dispose()
    # The server's operator allows everything, so only the worker's own check stands in the way.
    server_settings = dataclasses.replace(settings, execution_policy=ExecutionPolicy(workload_globs=("*",)))
    refused_marker, allowed_marker = tmp_path / "refused", tmp_path / "allowed"
    with (
        LiveServer(server_settings) as live,
        httpx.Client(base_url=live.url, timeout=30, headers={"Authorization": f"Bearer {writer}"}) as http,
    ):
        for name, marker, policy in (
            ("refused", refused_marker, ExecutionPolicy()),
            ("allowed", allowed_marker, ExecutionPolicy(workload_globs=("os",))),
        ):
            study = http.post(f"{API}/studies", json=system_study(name, marker))
            assert study.status_code == 201, study.text
            options = WorkerOptions(
                unconfined=True,
                server_url=live.url,
                token=worker_token,
                artifact_root=settings.artifact_root,
                idle_poll_seconds=0.2,
                exit_when_idle_seconds=60,
                warm_up=False,
                policy=policy,
            )
            # A worker that does not announce its allow-list is handed the trial: its own check refuses it.
            Worker(options, client=SilentClient(live.url, worker_token)).run(until=study_done(http, study.json()["id"]))
            (trial,) = trials(http, study.json()["id"])
            assert (trial["status"], trial["fail_kind"]) == ("failed", "config"), trial
            if name == "refused":
                assert "--allow-workload" in trial["error"] and "'os'" in trial["error"]
        # A built-in workload trains end to end; its process posts with the trial token only.
        study = http.post(f"{API}/studies", json=tiny_study()).json()
        options = dataclasses.replace(options, policy=ExecutionPolicy())
        Worker(options).run(until=study_done(http, study["id"]))
        (trial,) = trials(http, study["id"])
        assert trial["status"] == "completed", trial
        points = http.get(f"{API}/trials/{trial['id']}/metrics", params={"name": "train/loss"}).json()
        assert points["total"] == 5
    assert not refused_marker.exists(), "the refused workload ran"
    # The allowed one ran (then failed: os.system is no workload), and its environment held
    # neither the worker's token nor the writer's.
    environment = allowed_marker.read_text()
    assert "PATH=" in environment and worker_token not in environment and writer not in environment


def test_trial_jobs_carry_the_trial_token_never_the_workers(tmp_path: Path) -> None:
    worker_client = ServerClient("http://hpo", token="hpo_worker-secret")
    settings = JobSettings(tmp_path, worker_client, board=None)
    claim = {
        "trial_id": 3,
        "attempt": 1,
        "lease_id": "lease",
        "config": {"params": {}, "trainer": {"workload": "synthetic_mlp"}, "resources": {}},
        "trial_token": "hpot.3.lease.mac",
    }
    job = build_job(claim, settings)
    pickled = pickle.dumps(job)
    assert b"hpo_worker-secret" not in pickled and b"hpot.3.lease.mac" in pickled
    assert pickle.loads(pickled).client.token == "hpot.3.lease.mac"
    assert build_job({**claim, "trial_token": None}, settings).client.token is None


def test_the_worker_command_drops_secrets_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in worker_cli.SECRET_VARIABLES:
        monkeypatch.setenv(name, "secret")
    worker_cli._scrub_secrets()
    assert not any(name in os.environ for name in worker_cli.SECRET_VARIABLES)


def test_commands_and_workloads_are_checked_against_the_policy() -> None:
    policy = ExecutionPolicy(workload_globs=("mylab.*",), command_prefixes=(("python", "train.py"),))
    assert execution_refusal({"trainer": {"workload": "digits"}}, policy) is None
    assert execution_refusal({"trainer": {"workload": "mylab.nets:Big"}}, policy) is None
    assert "--allow-workload" in (execution_refusal({"trainer": {"workload": "os:system"}}, policy) or "")
    assert execution_refusal({"trainer": {"command": ["python", "train.py", "-v"]}}, policy) is None
    assert "--allow-command" in (execution_refusal({"trainer": {"command": ["python", "evil.py"]}}, policy) or "")
    assert "list of strings" in (execution_refusal({"trainer": {"command": "python train.py"}}, policy) or "")
    assert "LD_PRELOAD" in (execution_refusal({"trainer": {"env": {"LD_PRELOAD": "/tmp/x.so"}}}, policy) or "")
    harmless = {"trainer": {"command": ["python", "train.py"], "env": {"WANDB_MODE": "offline"}}}
    assert execution_refusal(harmless, policy) is None
    # An allow-list: a name neither on the short list nor allowed by the operator is refused.
    assert "--allow-env" in (execution_refusal({"trainer": {"env": {"SEED_NOTE": "a"}}}, policy) or "")
    allowing = ExecutionPolicy(env_globs=("SEED_*",))
    assert execution_refusal({"trainer": {"env": {"SEED_NOTE": "a"}}}, allowing) is None
