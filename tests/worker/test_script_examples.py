"""The example scripts (examples/scripts/) run as studies through the real worker, cut down to a few
steps: a plain PyTorch script, one using `hpo.session()`, one written for `torchrun` as 2 DDP
processes under Ray Train. The helper script's resume is exact: stopped by SIGTERM and resumed from
its checkpoint, it reports what an uninterrupted run reports."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.command import CommandRun, CommandSettings
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import REPO, create_study, metric_steps, study_done, trials
from tests.worker.test_command import Recorder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLES = REPO / "examples" / "scripts"


def example(name: str, **trainer: Any) -> dict[str, Any]:
    """The example spec with `python` as this interpreter, one trial per arm and fewer steps."""
    spec = json.loads((EXAMPLES / name).read_text())
    spec["num_trials"] = 1
    spec["trainer"]["command"][0] = sys.executable
    spec["trainer"].update(trainer)
    return spec


@pytest.fixture
def env(ray_address: str, tmp_path: Path) -> Any:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'hpo.db'}",
        artifact_root=tmp_path / "artifacts",
        lease_seconds=30,
        execution_policy=ExecutionPolicy(command_prefixes=(("python",), (sys.executable,))),
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, settings


def run_studies(server: LiveServer, http: httpx.Client, settings: Settings, specs: list[dict[str, Any]]) -> list[int]:
    ids = [create_study(http, spec)["id"] for spec in specs]
    prefixes = tuple(shlex.join(spec["trainer"]["command"][:2]) for spec in specs)
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
    return ids


def test_the_example_scripts_run_as_studies(env: Any) -> None:
    server, http, settings = env
    specs = [
        example("digits-plain.json"),
        example("digits-session.json", max_train_steps=40, eval_every_steps=20),
        example("digits-ddp.json", max_train_steps=40, eval_every_steps=20),
    ]
    specs[1]["hyperparameters"][0]["values"] = [32]  # one arm
    plain, session, ddp = run_studies(server, http, settings, specs)
    for study_id, steps, every in ((plain, 69, 23), (session, 40, 20), (ddp, 40, 20)):
        (trial,) = trials(http, study_id)
        assert trial["status"] == "completed", trial
        assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, steps + 1))
        evaluated = [s for s, _ in metric_steps(http, trial["id"], "valid/error_rate")]
        assert evaluated == list(range(every, steps + 1, every))
        assert trial["objective_value"] < 0.85, "better than chance (0.9)"
    (ddp_trial,) = trials(http, ddp)
    attempt = settings.artifact_root / "trials" / str(ddp_trial["id"]) / "attempt-1"
    assert (attempt / "checkpoints" / "step-40.pt").exists(), "rank 0 wrote the checkpoints"
    rank1 = attempt.with_name("attempt-1.rank-1")
    assert rank1.is_dir() and not (rank1 / "metrics.jsonl").exists(), "rank 1 ran beside rank 0 and wrote nothing"


def test_the_session_example_resumes_exactly_after_a_stop(tmp_path: Path) -> None:
    def config(resume_from: str | None = None) -> dict[str, Any]:
        trainer = {"command": [sys.executable, "digits_session.py"], "max_train_steps": 150, "eval_every_steps": 20,
                   "keep_best_checkpoints": 5, "resume_from": resume_from}  # fmt: skip
        return {"params": {"hidden": 32, "learning_rate": 0.05}, "seed": 3, "trainer": trainer,
                "objective": {"metric": "valid/error_rate", "mode": "min"}}  # fmt: skip

    def run(out: str, cfg: dict[str, Any], recorder: Recorder) -> Any:
        settings = CommandSettings(argv=tuple(cfg["trainer"]["command"]), cwd=EXAMPLES, out_dir=tmp_path / out)
        return CommandRun(settings, cfg, recorder, recorder).run()

    whole = Recorder()
    assert run("whole", config(), whole).status == "completed"

    class StopAtFirstCheckpoint(Recorder):
        def should_stop(self) -> bool:
            return bool(self.points) and max(s for s, _, _ in self.points) >= 25

    stopped = StopAtFirstCheckpoint()
    assert run("stopped", config(), stopped).status == "stopped"
    step, path, _ = stopped.checkpoints[-1]
    assert step >= 25 and path.endswith(f"step-{step}.pt")
    resumed = Recorder()
    assert run("resumed", config(path), resumed).status == "completed"
    assert resumed.points[0][0] == step + 1
    assert [p for p in stopped.points if p[0] <= step] + resumed.points == whole.points
    # Resumed from the checkpoint of its last step, an attempt has nothing left to train: it
    # completes without writing a point (not a `config` failure of a script that ignores the protocol).
    last_step, last_path, _ = whole.checkpoints[-1]
    assert last_step == 150
    finished = Recorder()
    assert run("finished", config(last_path), finished).status == "completed"
    assert finished.points == []
