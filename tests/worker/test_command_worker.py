"""`trainer.command` trials through the whole worker: the real server (SQLite), the session's Ray
instance, real script processes. A crash is retried then failed with its stderr; a command outside
the allow-list fails as `config` without running; a SIGKILLed worker's trial is resumed by another
from the script's newest checkpoint with the history of an uninterrupted twin; a cancelled trial's
script that ignores SIGTERM is killed after the grace period."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.command import worker_dir
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import (
    API,
    REPO,
    SilentClient,
    create_study,
    fault_server,
    fault_settings,
    metric_steps,
    study_done,
    trials,
    wait_until,
)
from tests.worker.test_faults import assert_same_as_twin, first_step_of, mid_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WORKDIR_ROOT = Path(__file__).parent  # trainer.workdir "scripts" is tests/worker/scripts
COMMAND = [sys.executable, "counter.py"]
ALLOW = (shlex.join(COMMAND),)
# The server's operator allows this interpreter; each test's worker has its own, narrower list.
SERVER_ALLOWS = ExecutionPolicy(command_prefixes=((sys.executable,),))


@pytest.fixture
def server(ray_address: str, tmp_path: Path) -> Iterator[tuple[LiveServer, httpx.Client, Settings]]:
    with fault_server(tmp_path, SERVER_ALLOWS) as running:
        yield running


def command_study(params: dict[str, Any], copies: int = 1, steps: int = 60, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "script",
        "algorithm": "manual",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "hyperparameters": [{"name": k, "role": "fixed", "value": v} for k, v in params.items()],
        "trials": [{"params": {}, "seed": 7} for _ in range(copies)],
        "trainer": {
            "command": COMMAND,
            "workdir": "scripts",
            "max_train_steps": steps,
            "eval_every_steps": 10,
            "keep_best_checkpoints": 2,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    spec.update(overrides)
    return spec


def run_worker(url: str, settings: Settings, until: Any, **options: Any) -> Worker:
    client = SilentClient(url) if options.pop("silent", False) else None
    worker = Worker(
        WorkerOptions(
            unconfined=True,
            server_url=url,
            artifact_root=settings.artifact_root,
            idle_poll_seconds=0.2,
            exit_when_idle_seconds=options.pop("exit_when_idle_seconds", 60),
            flush_seconds=0.2,
            policy=ExecutionPolicy().merged(command_prefixes=options.pop("allow_commands", ALLOW)),
            workdir_root=options.pop("workdir_root", WORKDIR_ROOT),
            warm_up=False,
            **options,
        ),
        client=client,
    )
    worker.run(until=until)
    return worker


def test_a_script_trial_completes_with_its_history_checkpoints_and_objective(server: Any) -> None:
    live, http, settings = server
    study = create_study(http, command_study({"step_seconds": 0.01}))
    run_worker(live.url, settings, study_done(http, study["id"]))
    (trial,) = trials(http, study["id"])
    assert (trial["status"], trial["attempt"]) == ("completed", 1), trial
    assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, 61))
    errors = metric_steps(http, trial["id"], "valid/error_rate")
    best_step, best_value = min(errors, key=lambda point: point[1])
    assert (trial["best_step"], trial["objective_value"]) == (best_step, best_value)
    recorded = [c["step"] for c in http.get(f"{API}/trials/{trial['id']}/checkpoints").json()]
    assert 60 in recorded and best_step in recorded
    on_disk = sorted(
        p.name for p in (settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1" / "checkpoints").iterdir()
    )
    assert len(on_disk) <= 3, f"keep_best_checkpoints=2 plus the newest, got {on_disk}"


def test_a_crashing_script_is_retried_then_failed_with_its_stderr(server: Any) -> None:
    live, http, settings = server
    study = create_study(http, command_study({"mode": "crash"}, max_attempts=2, max_failed_trials=100))
    run_worker(live.url, settings, study_done(http, study["id"]))
    (trial,) = trials(http, study["id"])
    assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("failed", "error", 2)
    assert "exited with status 3" in trial["error"] and "ValueError: the data folder is empty" in trial["error"]


def test_a_command_outside_the_allow_list_fails_as_config_without_running(server: Any) -> None:
    """Handed a trial its allow-list refuses (by a server it did not tell), the worker refuses it."""
    live, http, settings = server
    study = create_study(http, command_study({}, max_failed_trials=100))
    run_worker(live.url, settings, study_done(http, study["id"]), allow_commands=("python other.py",), silent=True)
    (trial,) = trials(http, study["id"])
    assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("failed", "config", 1)
    assert "--allow-command" in trial["error"]
    assert not (settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1" / "metrics.jsonl").exists()


def test_a_cancelled_script_that_ignores_sigterm_is_killed_after_the_grace_period(server: Any) -> None:
    live, http, settings = server
    study = create_study(http, command_study({"mode": "stubborn", "step_seconds": 0.05}, steps=100_000))
    (trial,) = trials(http, study["id"])
    log = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1" / "metrics.jsonl"

    def cancel() -> None:
        wait_until(lambda: log.exists() and log.stat().st_size > 0, 60, "the script to write")
        http.post(f"{API}/trials/{trial['id']}/cancel").raise_for_status()

    import threading

    canceller = threading.Thread(target=cancel, daemon=True)
    canceller.start()
    started = time.monotonic()
    run_worker(live.url, settings, study_done(http, study["id"]), stop_grace_seconds=1.0)
    canceller.join(5)
    assert http.get(f"{API}/trials/{trial['id']}").json()["status"] == "cancelled"
    assert time.monotonic() - started < 60
    size = log.stat().st_size
    time.sleep(0.5)
    assert log.stat().st_size == size, "the script outlived its trial"


def start_worker(url: str, ray_address: str, settings: Settings) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "hpo.cli", "worker", "--server", url, "--ray-address", ray_address,
        "--max-trials", "1", "--exit-when-idle", "60", "--log-level", "warning", "--unconfined",
        "--allow-command", ALLOW[0], "--workdir-root", str(WORKDIR_ROOT),
    ]  # fmt: skip
    env = {**os.environ, "HPO_ARTIFACT_ROOT": str(settings.artifact_root)}
    return subprocess.Popen(command, cwd=REPO, env=env)


def test_a_sigkilled_worker_s_script_trial_resumes_elsewhere_like_its_uninterrupted_twin(
    server: Any, ray_address: str
) -> None:
    live, http, settings = server
    study = create_study(http, command_study({"step_seconds": 0.05}, copies=2, steps=120))
    victim, twin = (t["id"] for t in trials(http, study["id"]))
    worker = start_worker(live.url, ray_address, settings)
    try:
        wait_until(lambda: mid_run(http, victim, 20), 90, "the first trial to be mid-run")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        orphan_log = settings.artifact_root / "trials" / str(victim) / "attempt-1" / "metrics.jsonl"
        time.sleep(2)
        size_after_kill = orphan_log.stat().st_size
        run_worker(live.url, settings, study_done(http, study["id"]))
    finally:
        worker.kill()
    assert orphan_log.stat().st_size == size_after_kill, "the killed worker's script went on training"
    assert http.get(f"{API}/trials/{victim}").json()["attempt"] == 2
    assert first_step_of(settings, victim, 2) > 1, "attempt 2 resumed from a checkpoint"
    assert_same_as_twin(http, victim, twin, 120)


def test_a_lost_lease_sends_sigterm_then_sigkill_and_the_trial_resumes(ray_address: str, tmp_path: Path) -> None:
    """The server is down longer than the lease and the lease is reaped meanwhile: the worker's next
    heartbeat gets 409, and the script (which ignores SIGTERM) is killed after the grace period; the
    same trial's next attempt resumes from its checkpoint and completes without a gap."""
    from hpo.server.db import Database
    from hpo.server.trials.leases import reap_expired
    from hpo.worker.demo import EmbeddedServer

    settings = fault_settings(tmp_path, SERVER_ALLOWS)
    servers = [EmbeddedServer(settings, 0).__enter__()]
    http = httpx.Client(base_url=servers[0].url, timeout=30)
    study = create_study(http, command_study({"mode": "stubborn", "step_seconds": 0.05}, steps=200))
    (trial,) = trials(http, study["id"])
    log = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1" / "metrics.jsonl"
    killed_at: list[int] = []

    def lose_the_lease() -> None:
        wait_until(lambda: log.exists() and log.stat().st_size > 2000, 60, "the script to checkpoint")
        servers[0].__exit__()
        time.sleep(3.5)
        database = Database(settings.database_url)
        assert reap_expired(database) == 1
        database.dispose()
        servers.append(EmbeddedServer(settings, servers[0].port).__enter__())
        wait_until(lambda: _stopped_growing(log), 30, "the attempt-1 script to die")
        killed_at.append(len(log.read_text().splitlines()))

    import threading

    thief = threading.Thread(target=lose_the_lease, daemon=True)
    thief.start()
    try:
        run_worker(servers[0].url, settings, _reachable_and(study_done(http, study["id"])), stop_grace_seconds=1.0)
        thief.join(30)
        assert killed_at, "the attempt-1 script was stopped"
        final = http.get(f"{API}/trials/{trial['id']}").json()
        assert (final["status"], final["attempt"]) == ("completed", 2)
        assert [s for s, _ in metric_steps(http, trial["id"], "train/loss")] == list(range(1, 201))
        assert first_step_of(settings, trial["id"], 2) > 1, "attempt 2 resumed from attempt 1's checkpoint"
    finally:
        http.close()
        servers[-1].__exit__()


def _stopped_growing(path: Path) -> bool:
    size = path.stat().st_size
    time.sleep(1.5)
    return path.stat().st_size == size


def _reachable_and(done: Any) -> Any:
    def check() -> bool:
        try:
            return bool(done())
        except httpx.TransportError:
            return False

    return check


def test_checkpoint_records_follow_the_scripts_own_deletions_and_a_killed_trial_resumes_from_a_survivor(
    server: Any, ray_address: str
) -> None:
    """The script keeps only its first checkpoint and its newest (folders, as Hugging Face and
    Lightning write them). The server must never keep records of the folders it deleted, and a
    trial whose worker is SIGKILLed resumes from a checkpoint that still exists."""
    live, http, settings = server
    study = create_study(http, command_study({"step_seconds": 0.05, "mode": "keep_first"}, steps=120))
    (trial,) = trials(http, study["id"])
    worker = start_worker(live.url, ray_address, settings)
    try:

        def past_step_45() -> bool:
            return max((s for s, _ in metric_steps(http, trial["id"], "train/loss")), default=0) >= 45

        wait_until(past_step_45, 90, "the trial to be past step 45")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        run_worker(live.url, settings, study_done(http, study["id"]))
    finally:
        worker.kill()
    done = http.get(f"{API}/trials/{trial['id']}").json()
    assert (done["status"], done["attempt"]) == ("completed", 2), done
    attempt2 = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-2"
    resume_from = json.loads((worker_dir(attempt2) / "hpo-config.json").read_text())["resume_from"]
    assert resume_from is not None and Path(resume_from).is_dir(), f"resumed from {resume_from!r}"
    assert first_step_of(settings, trial["id"], 2) > 1, "attempt 2 started from scratch"
    records = http.get(f"{API}/trials/{trial['id']}/checkpoints").json()
    latest = [c["step"] for c in records if c["uri"].startswith(f"trials/{trial['id']}/attempt-2/")]
    on_disk = sorted(int(p.name.removeprefix("step-")) for p in (attempt2 / "checkpoints").glob("step-*"))
    assert sorted(latest) == on_disk, f"records {sorted(latest)} for files {on_disk}"


def test_a_worker_never_claims_a_trial_its_allow_list_refuses(server: Any) -> None:
    """The worker tells the server what it may run: a study it may not run waits, untouched, for a
    worker that may (instead of failing as config on the first worker that passes by)."""
    live, http, settings = server
    study = create_study(http, command_study({"step_seconds": 0.0}, copies=2, steps=10))
    worker = run_worker(
        live.url, settings, lambda: False, allow_commands=("python other.py",), exit_when_idle_seconds=2
    )
    assert worker.stats.claimed == 0
    untouched = trials(http, study["id"])
    assert [(t["status"], t["attempt"]) for t in untouched] == [("pending", 0), ("pending", 0)], untouched
    run_worker(live.url, settings, study_done(http, study["id"]))
    assert [t["status"] for t in trials(http, study["id"])] == ["completed", "completed"]


def test_a_study_paused_by_refused_commands_says_why_and_its_trials_can_be_retried(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker whose workdir root lacks the command's workdir fails the trials as config and the
    study pauses itself; the study says why (API and `hpo study show`); `hpo study retry` runs them
    again as new trials, which a worker that has the workdir completes."""
    from hpo.cli import main

    live, http, settings = server
    study = create_study(http, command_study({"step_seconds": 0.0}, copies=2, steps=10, max_failed_trials=2))
    run_worker(live.url, settings, study_done(http, study["id"]), workdir_root=tmp_path)
    paused = http.get(f"{API}/studies/{study['id']}").json()
    assert paused["status"] == "paused", paused
    assert "paused itself after 2 failed trials" in paused["status_reason"], paused
    assert "trainer.workdir" in paused["status_reason"]
    assert main(["study", "show", str(study["id"]), "--server", live.url]) == 0
    assert "paused itself after 2 failed trials" in capsys.readouterr().out
    assert main(["study", "analyze", str(study["id"]), "--server", live.url]) == 0
    assert "[paused] paused itself after 2 failed trials" in capsys.readouterr().out
    assert main(["study", "retry", str(study["id"]), "--kind", "config", "--server", live.url]) == 0
    assert "2 failed trial(s)" in capsys.readouterr().out
    again = http.post(f"{API}/studies/{study['id']}/retry", json={})
    assert again.status_code == 201 and again.json()["trial_ids"] == [], "a failed trial is retried once"
    run_worker(live.url, settings, study_done(http, study["id"]))
    done = trials(http, study["id"])
    assert sorted(t["status"] for t in done) == ["completed", "completed", "failed", "failed"]
    retried = {t["retry_of"]: t for t in done if t["retry_of"] is not None}
    assert set(retried) == {t["id"] for t in done if t["status"] == "failed"}
    assert all(retried[f]["seed"] == next(t["seed"] for t in done if t["id"] == f) for f in retried)
    assert http.get(f"{API}/studies/{study['id']}").json()["status"] == "completed"
    refused = http.post(f"{API}/trials/{retried[min(retried)]['id']}/retry")
    assert refused.status_code == 409 and "only a failed trial" in refused.text
