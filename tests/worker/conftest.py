"""Worker fixtures: one small local Ray instance for the whole session (2 CPUs, no dashboard), which
in-process workers use directly and subprocess workers join by address; helpers to make studies
and run a worker until a condition holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.client import ServerClient

REPO = Path(__file__).resolve().parents[2]
API = "/api/v1"
FAKE_TRAINER = "tests.worker.fake_trainer:train"
FAKE_WORKLOAD = "tests.worker.fake_trainer:Workload"  # a user workload: names the server cannot check
# The operator's allow-list of these tests, on the server and on the workers (docs/security.md).
TESTS_ALLOWED = ExecutionPolicy(workload_globs=("tests.*",))


@pytest.fixture
def fast_settings(database_url: str, tmp_path: Path) -> Settings:
    """Short leases, so heartbeats, expiry and the reaper happen within a test."""
    return Settings(
        database_url=database_url,
        artifact_root=tmp_path / "artifacts",
        lease_seconds=4,
        execution_policy=TESTS_ALLOWED,
    )


def fault_settings(tmp_path: Path, policy: ExecutionPolicy) -> Settings:
    """An embedded SQLite server's settings with a 3 s lease, so lost leases are noticed quickly."""
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'hpo.db'}",
        artifact_root=tmp_path / "artifacts",
        lease_seconds=3,
        execution_policy=policy,
    )


@contextmanager
def fault_server(tmp_path: Path, policy: ExecutionPolicy) -> Iterator[tuple[Any, httpx.Client, Settings]]:
    """A live server on `fault_settings`, with a client: (server, client, settings)."""
    from tests.conftest import LiveServer

    settings = fault_settings(tmp_path, policy)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        yield live, http, settings


def worker_spec(name: str = "worker-test", **overrides: Any) -> dict[str, Any]:
    """A small halton study on the fake trainer: 2 arms x `num_trials`, 60 steps."""
    spec: dict[str, Any] = {
        "name": name,
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": 1,
        "hyperparameters": [
            {"name": "arm", "role": "scientific", "type": "categorical", "values": ["a", "b"]},
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0, "scale": "log"},
            {"name": "step_seconds", "role": "fixed", "value": 0.0},
        ],
        # The fake trainer's params are not the built-in workloads' names, which the server checks at creation.
        "trainer": {"workload": FAKE_WORKLOAD, "max_train_steps": 60, "eval_every_steps": 10},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        "max_attempts": 3,
    }
    spec.update(overrides)
    return spec


def fixed(spec: dict[str, Any], **values: Any) -> dict[str, Any]:
    """The spec with fixed hyperparameters set (added when missing)."""
    hps = [hp for hp in spec["hyperparameters"] if hp["name"] not in values]
    spec["hyperparameters"] = hps + [{"name": k, "role": "fixed", "value": v} for k, v in values.items()]
    return spec


class SilentClient(ServerClient):
    """A worker's client that does not tell the server what its operator allows (as an hpo worker
    from before capabilities did): the server may hand it anything, so the worker's own allow-list
    check is what stands between a study and the node."""

    def claim(
        self,
        worker_id: str,
        cpus: float,
        gpus: float,
        capabilities: dict[str, Any] | None = None,
        retry_for: float = 0,
    ) -> dict[str, Any] | None:
        return super().claim(worker_id, cpus, gpus, None, retry_for)


def create_study(http: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"{API}/studies", json=spec)
    assert response.status_code == 201, response.text
    return dict(response.json())


def trials(http: httpx.Client, study_id: int) -> list[dict[str, Any]]:
    return list(http.get(f"{API}/studies/{study_id}/trials", params={"limit": 1000}).json()["items"])


def metric_steps(http: httpx.Client, trial_id: int, name: str) -> list[tuple[int, Any]]:
    points = http.get(f"{API}/trials/{trial_id}/metrics", params={"name": name, "limit": 100_000}).json()["items"]
    return [(p["step"], p["value"]) for p in points]


def study_done(http: httpx.Client, study_id: int) -> Callable[[], bool]:
    def done() -> bool:
        counts = http.get(f"{API}/studies/{study_id}").json()["trial_counts"]
        return counts["pending"] + counts["running"] == 0

    return done


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def in_background(action: Callable[[], None]) -> threading.Thread:
    """Runs a scripted intervention (pause a study, stop the server) while the worker runs."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # surfaced by the test through `thread.errors`
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread
