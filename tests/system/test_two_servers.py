"""Several servers, one Postgres (docs/workers.md, "Several servers, one database"): two real `hpo
server` processes on two ports share a database and a signing key; workers speak the worker protocol
through `ServerClient` given both URLs, half of them starting at each server. One server is killed
(SIGKILL, its whole process group) while trials run. Every trial is handed out once (a claim whose
answer was lost is handed out again only after its lease expired) and completes, a trial token
issued by one server writes through the other, and every acknowledged metric point is stored exactly
once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.worker.client import LeaseLost, ServerClient
from tests.conftest import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TRIALS = 40
WORKERS = 6
BATCHES, POINTS = 4, 25  # per trial: 100 points in 4 batches
SPEC = {
    "name": "two-servers",
    "num_trials": TRIALS,
    "objective": {"metric": "valid/error_rate", "mode": "min"},
    "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0}],
}


def _start(database_url: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(
        command,
        env={**env, "HPO_DATABASE_URL": database_url},
        start_new_session=True,  # its own process group: the kill takes its helpers too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


@pytest.fixture
def two_servers(postgres_url: str, tmp_path: Any) -> Iterator[tuple[list[str], list[Any], dict[str, str]]]:
    db = Database(postgres_url)
    db.upgrade()
    tokens = {role: auth.create_token(db, role)[1] for role in ("worker", "write")}
    db.dispose()
    env = {
        **os.environ,
        "HPO_SESSION_SECRET": "two-servers-share-this-signing-key-0123456789",
        "HPO_LEASE_SECONDS": "6",
        "HPO_ARTIFACT_ROOT": str(tmp_path / "artifacts"),
        "HPO_BAYESIAN_PROCESSES": "0",
    }
    env.pop("HPO_API_TOKEN", None)
    ports = [free_port(), free_port()]
    processes = [_start(postgres_url, port, env) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, process in zip(urls, processes, strict=True):
            _wait_ready(url, process)
        yield urls, processes, tokens
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


class Fleet:
    """Worker threads on the protocol; what they were handed and what was acknowledged."""

    def __init__(self, urls: list[str], token: str) -> None:
        self.urls, self.token = urls, token
        self.lock = threading.Lock()
        self.claims: list[tuple[int, str]] = []
        self.served_by: dict[str, int] = {}
        self.acknowledged: set[tuple[int, str, int]] = set()
        self.completed: set[int] = set()
        self.errors: list[str] = []

    def run(self, index: int) -> None:
        client = ServerClient(",".join(self.urls), self.token, timeout=10, start=index)
        try:
            deadline = time.monotonic() + 80
            while True:
                claim = client.claim(f"w{index}", 1, 0, retry_for=30)
                if claim is None:
                    # Like worker.loop: poll while the study has unfinished trials. A claim the
                    # killed server committed but never answered leaves its trial leased to no
                    # one until the lease expires; then it is pending again and handed out here.
                    with self.lock:
                        if len(self.completed) == TRIALS or time.monotonic() > deadline:
                            return
                    time.sleep(0.2)
                    continue
                with self.lock:
                    self.claims.append((claim["trial_id"], claim["lease_id"]))
                    self.served_by[client.base_url] = self.served_by.get(client.base_url, 0) + 1
                self._run_trial(client, claim)
        except Exception as exc:  # reported by the test, never swallowed
            self.errors.append(f"worker {index}: {type(exc).__name__}: {exc}")

    def _run_trial(self, client: ServerClient, claim: dict[str, Any]) -> None:
        trial_id, lease = claim["trial_id"], claim["lease_id"]
        # Points go with the trial token (signed by whichever server answered the claim).
        reporter = client.for_trial(claim["trial_token"])
        for batch in range(BATCHES):
            steps = range(batch * POINTS, (batch + 1) * POINTS)
            points = [{"step": s, "name": "valid/error_rate", "value": 1.0 / (1 + s)} for s in steps]
            reporter.post_metrics(trial_id, lease, points, retry_for=30)
            with self.lock:
                self.acknowledged.update((trial_id, "valid/error_rate", s) for s in steps)
            client.heartbeat(trial_id, lease, retry_for=30)
            time.sleep(0.02)
        # LeaseLost: a complete that reached the killed server, retried on the other (the test
        # then checks the database: every trial completed).
        with contextlib.suppress(LeaseLost):
            client.complete(trial_id, lease, retry_for=30)
        with self.lock:
            self.completed.add(trial_id)


def test_two_servers_one_postgres_one_killed(two_servers: Any, postgres_url: str) -> None:
    urls, processes, tokens = two_servers
    created = httpx.post(
        f"{urls[0]}/api/v1/studies", json=SPEC, headers={"Authorization": f"Bearer {tokens['write']}"}, timeout=30
    )
    assert created.status_code == 201, created.text
    # A claim whose answer never reaches its worker (as when a server dies between commit and
    # reply, which the kill below may or may not hit): its trial must still be run, by another
    # worker once the lease expires, and never be handed out twice while the lease holds.
    orphan = httpx.post(
        f"{urls[1]}/api/v1/workers/claim",
        json={"worker_id": "lost", "resources": {"cpus": 1, "gpus": 0}},
        headers={"Authorization": f"Bearer {tokens['worker']}"},
        timeout=30,
    )
    assert orphan.status_code == 200, orphan.text
    fleet = Fleet(urls, tokens["worker"])
    threads = [threading.Thread(target=fleet.run, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(fleet.completed) < TRIALS // 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    served_before_kill = dict(fleet.served_by)
    os.killpg(processes[0].pid, signal.SIGKILL)  # mid-run: requests in flight on it fail over
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    assert fleet.errors == []
    assert set(served_before_kill) == set(urls), served_before_kill  # both served before the kill

    trial_ids = [trial_id for trial_id, _ in fleet.claims]
    assert len(trial_ids) == len(set(trial_ids)) == TRIALS  # nothing handed out twice
    assert fleet.completed == set(trial_ids)
    engine = Database(postgres_url).engine
    with engine.connect() as connection:
        statuses = dict(connection.execute(text("SELECT status, count(*) FROM trials GROUP BY status")).all())
        stored = connection.execute(text("SELECT trial_id, name, step FROM metric_points")).all()
        counts = dict(connection.execute(text("SELECT id, point_count FROM trials")).all())
    engine.dispose()
    assert statuses == {"completed": TRIALS}
    stored_keys = {tuple(row) for row in stored}
    assert len(stored) == len(stored_keys) == TRIALS * BATCHES * POINTS  # each point once
    assert fleet.acknowledged <= stored_keys  # no acknowledged point lost
    assert set(counts.values()) == {BATCHES * POINTS}  # the quota's count agrees on every trial
