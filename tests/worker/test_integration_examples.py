"""The framework callbacks' examples (examples/integrations/) run as studies through the real
server and a Ray worker, cut down to one trial of 60 steps each: a PyTorch Lightning script with
`HpoCallback` and a Hugging Face `Trainer` script with `HpoTrainerCallback`, both given their
hyperparameters as flags through placeholders. The worker reads their metrics and records the
checkpoints they leave under hpo's names (docs/scripts.md, "Framework callbacks")."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import API, REPO, create_study, metric_steps, study_done, trials

EXAMPLES = REPO / "examples" / "integrations"


def example(name: str) -> dict[str, Any]:
    spec = json.loads((EXAMPLES / name).read_text())
    spec["num_trials"] = 1
    spec["hyperparameters"][0]["values"] = [64]  # one arm
    spec["trainer"].update(max_train_steps=60, eval_every_steps=30)
    return spec


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_lightning_and_hugging_face_examples_run_as_studies(ray_address: str, tmp_path: Path) -> None:
    specs = [example("lightning-digits.json"), example("hf-digits.json")]
    prefixes = tuple(shlex.join(spec["trainer"]["command"][:2]) for spec in specs)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'hpo.db'}",
        artifact_root=tmp_path / "artifacts",
        lease_seconds=30,
        execution_policy=ExecutionPolicy(command_prefixes=tuple(tuple(shlex.split(p)) for p in prefixes)),
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        ids = [create_study(http, spec)["id"] for spec in specs]
        options = WorkerOptions(
            unconfined=True,
            server_url=server.url,
            artifact_root=settings.artifact_root,
            idle_poll_seconds=0.2,
            policy=ExecutionPolicy().merged(command_prefixes=prefixes),
            workdir_root=REPO,
            warm_up=False,
        )
        Worker(options).run(until=lambda: all(study_done(http, i)() for i in ids))
        for study_id, suffix in zip(ids, (".ckpt", ""), strict=True):
            (trial,) = trials(http, study_id)
            assert trial["status"] == "completed", trial
            assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, 61))
            assert [s for s, _ in metric_steps(http, trial["id"], "valid/error_rate")] == [30, 60]
            assert trial["objective_value"] < 0.5, "better than chance (0.9)"
            recorded = http.get(f"{API}/trials/{trial['id']}/checkpoints").json()
            recorded = recorded["items"] if isinstance(recorded, dict) else recorded
            assert sorted(c["step"] for c in recorded) == [30, 60], recorded
            assert all(c["uri"].endswith(f"checkpoints/step-{c['step']}{suffix}") for c in recorded), recorded
