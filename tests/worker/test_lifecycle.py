"""A worker in this process against the real server (SQLite and Postgres) and the session's Ray
instance, with a stand-in trainer that misbehaves on cue: user-code exceptions are retried up to
max_attempts, divergence is infeasible, a bad config fails at once, a paused study preempts its
runs (which resume later without a gap), a cancelled trial stops, and a server outage neither stops
training nor loses a point."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.settings import Settings
from hpo.worker.demo import EmbeddedServer
from hpo.worker.loop import Worker, WorkerOptions
from tests.conftest import LiveServer
from tests.worker.conftest import (
    API,
    FAKE_TRAINER,
    TESTS_ALLOWED,
    create_study,
    fixed,
    in_background,
    metric_steps,
    study_done,
    trials,
    wait_until,
    worker_spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def run_worker(url: str, root: Path, until: Any, **options: Any) -> Worker:
    worker = Worker(
        WorkerOptions(
            unconfined=True,
            server_url=url,
            artifact_root=root,
            trainer=FAKE_TRAINER,
            idle_poll_seconds=0.2,
            exit_when_idle_seconds=options.pop("exit_when_idle_seconds", 60),
            flush_seconds=0.2,
            policy=TESTS_ALLOWED,
            **options,
        )
    )
    worker.run(until=until)
    return worker


def assert_history_complete(http: httpx.Client, trial_id: int, steps: int, every: int) -> None:
    """Every step once, no gap, no duplicate (the server upserts, so duplicates would show as a
    count mismatch only through the listing; the listing is by (name, step))."""
    assert [s for s, _ in metric_steps(http, trial_id, "train/loss")] == list(range(1, steps + 1))
    assert [s for s, _ in metric_steps(http, trial_id, "valid/error_rate")] == list(range(every, steps + 1, every))


@pytest.fixture
def env(ray_address: str, fast_settings: Settings) -> Any:
    with LiveServer(fast_settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield server, http, fast_settings


def test_exception_in_user_code_is_retried_until_max_attempts_then_failed(env: Any) -> None:
    server, http, settings = env
    study = create_study(http, fixed(worker_spec(max_attempts=2, max_failed_trials=100), fail_at_step=5))
    worker = run_worker(server.url, settings.artifact_root, study_done(http, study["id"]))
    for trial in trials(http, study["id"]):
        assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("failed", "error", 2)
        assert trial["error"].startswith("RuntimeError: user code failed at step 5")
        assert (settings.artifact_root / "trials" / str(trial["id"]) / "attempt-2" / "metrics.jsonl").exists()
    assert worker.stats.claimed == 4 and worker.stats.max_running == 2


def test_divergence_is_infeasible_and_a_bad_config_fails_without_retry(env: Any) -> None:
    server, http, settings = env
    diverging = create_study(http, fixed(worker_spec("diverging"), diverge_at_step=7))
    broken = create_study(http, fixed(worker_spec("broken", max_failed_trials=100), bad=1))
    run_worker(
        server.url, settings.artifact_root, lambda: all(study_done(http, s["id"])() for s in (diverging, broken))
    )
    for trial in trials(http, diverging["id"]):
        assert (trial["status"], trial["fail_kind"], trial["error_step"], trial["attempt"]) == (
            "infeasible",
            "infeasible",
            7,
            1,
        )
    for trial in trials(http, broken["id"]):
        assert (trial["status"], trial["fail_kind"], trial["attempt"]) == ("failed", "config", 1)
        assert "unknown parameter" in trial["error"]


def test_paused_study_preempts_its_runs_which_resume_later_without_a_gap(env: Any) -> None:
    server, http, settings = env
    study = create_study(http, fixed(worker_spec(num_trials=1), step_seconds=0.1))
    sid = study["id"]

    def pause_then_resume() -> None:
        wait_until(lambda: any(_checkpoints(http, t["id"]) for t in trials(http, sid)), 30, "a checkpoint")
        http.patch(f"{API}/studies/{sid}", json={"status": "paused"}).raise_for_status()
        wait_until(lambda: all(t["status"] == "pending" for t in trials(http, sid)), 30, "runs given back")
        http.patch(f"{API}/studies/{sid}", json={"status": "active"}).raise_for_status()

    script = in_background(pause_then_resume)
    run_worker(server.url, settings.artifact_root, study_done(http, sid))
    script.join(5)
    assert not script.errors, script.errors  # type: ignore[attr-defined]
    for trial in trials(http, sid):
        assert (trial["status"], trial["attempt"]) == ("completed", 2)
        assert_history_complete(http, trial["id"], 60, 10)
        resumed = (settings.artifact_root / "trials" / str(trial["id"]) / "attempt-2" / "metrics.jsonl").read_text()
        assert not resumed.startswith('{"step": 1,'), "the second attempt resumed from a checkpoint"


def test_cancelled_trials_stop_promptly(env: Any) -> None:
    server, http, settings = env
    study = create_study(http, fixed(worker_spec(num_trials=1), step_seconds=0.2))
    sid = study["id"]

    def cancel_all() -> None:
        wait_until(lambda: all(t["status"] == "running" for t in trials(http, sid)), 30, "running trials")
        for trial in trials(http, sid):
            http.post(f"{API}/trials/{trial['id']}/cancel").raise_for_status()

    script = in_background(cancel_all)
    run_worker(server.url, settings.artifact_root, study_done(http, sid))
    script.join(5)
    assert not script.errors, script.errors  # type: ignore[attr-defined]
    for trial in trials(http, sid):
        assert trial["status"] == "cancelled"
        log = settings.artifact_root / "trials" / str(trial["id"]) / "attempt-1" / "metrics.jsonl"
        last_step = json.loads(log.read_text().splitlines()[-1])["step"]
        assert last_step < 40, f"60 steps of 0.2 s: the cancelled run went on to step {last_step}"


def test_server_outage_keeps_training_and_loses_no_point(ray_address: str, database_url: str, tmp_path: Path) -> None:
    settings = Settings(
        database_url=database_url,
        artifact_root=tmp_path / "artifacts",
        lease_seconds=15,
        execution_policy=TESTS_ALLOWED,
    )
    first = EmbeddedServer(settings, 0).__enter__()
    http = httpx.Client(base_url=first.url, timeout=30)
    study = create_study(http, fixed(worker_spec(num_trials=1), step_seconds=0.1))
    sid = study["id"]
    grew: list[int] = []
    servers = [first]

    def outage() -> None:
        wait_until(lambda: any((settings.artifact_root / "trials").glob("*/attempt-1/metrics.jsonl")), 30, "training")
        first.__exit__()
        try:
            log = next((settings.artifact_root / "trials").glob("*/attempt-1/metrics.jsonl"))
            size = log.stat().st_size
            time.sleep(4)
            grew.append(log.stat().st_size - size)
        finally:
            servers.append(EmbeddedServer(settings, first.port).__enter__())

    script = in_background(outage)
    try:
        run_worker(first.url, settings.artifact_root, _done_or_unreachable(http, sid))
        script.join(5)
        assert not script.errors, script.errors  # type: ignore[attr-defined]
        assert grew and grew[0] > 0, "training went on while the server was down"
        for trial in trials(http, sid):
            assert (trial["status"], trial["attempt"]) == ("completed", 1)
            assert_history_complete(http, trial["id"], 60, 10)
    finally:
        servers[-1].__exit__()


def _done_or_unreachable(http: httpx.Client, sid: int) -> Any:
    done = study_done(http, sid)

    def check() -> bool:
        try:
            return done()
        except httpx.TransportError:
            return False

    return check


def _checkpoints(http: httpx.Client, trial_id: int) -> list[dict[str, Any]]:
    return list(http.get(f"{API}/trials/{trial_id}/checkpoints").json())
