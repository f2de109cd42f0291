"""Claims under real concurrency on Postgres: 32 claimers over HTTP, 400 trials, each trial
claimed exactly once (FOR UPDATE SKIP LOCKED), and the same on SQLite's serialized writes."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from hpo.server.db import Database
from hpo.server.models import Trial
from hpo.server.studies import service as studies
from hpo.server.trials import leases
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.factories import study_spec


def _claim_everything(url: str, claimers: int) -> list[int]:
    claimed: list[int] = []
    lock = threading.Lock()
    failures: list[str] = []

    def run(worker: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while True:
                response = http.post(
                    "/api/v1/workers/claim", json={"worker_id": f"w{worker}", "resources": {"cpus": 4, "gpus": 0}}
                )
                if response.status_code == 204:
                    return
                if response.status_code != 200:
                    failures.append(response.text)
                    return
                with lock:
                    claimed.append(response.json()["trial_id"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    return claimed


def _study_with_400_trials(url: str) -> None:
    spec = study_spec(
        name="crowd",
        num_trials=400,
        hyperparameters=[
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
        ],
    )
    with httpx.Client(base_url=url) as http:
        assert http.post("/api/v1/studies", json=spec).status_code == 201


@pytest.mark.postgres
def test_32_claimers_on_postgres_claim_each_trial_once(postgres_url: str, tmp_path: Path) -> None:
    with LiveServer(Settings(database_url=postgres_url, artifact_root=tmp_path)) as server:
        _study_with_400_trials(server.url)
        claimed = _claim_everything(server.url, 32)
    assert len(claimed) == 400
    assert max(Counter(claimed).values()) == 1


def test_16_claimers_on_sqlite_claim_each_trial_once(tmp_path: Path) -> None:
    with LiveServer(Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}", artifact_root=tmp_path)) as server:
        _study_with_400_trials(server.url)
        claimed = _claim_everything(server.url, 16)
    assert len(claimed) == 400 and max(Counter(claimed).values()) == 1


@pytest.mark.postgres
def test_concurrent_reaping_of_expired_leases_never_deadlocks(postgres_url: str) -> None:
    """Every claim reaps expired leases first. With leases that expire at once, 32 claimers reap
    the same rows together: the reaper must skip rows others hold instead of deadlocking."""
    db = Database(postgres_url)
    db.upgrade()
    try:
        spec = study_spec(
            name="lapsing",
            num_trials=200,
            max_attempts=2,
            hyperparameters=[
                {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"}
            ],
        )
        study_id = studies.create_study(db, spec).id
        errors: list[BaseException] = []

        def run(worker: int) -> None:
            try:
                while leases.claim(db, f"w{worker}", 4, 0, lease_seconds=0.0) is not None:
                    pass
            except BaseException as exc:  # noqa: BLE001 (recorded and asserted below)
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        leases.reap_expired(db)
        while leases.claim(db, "drain", 4, 0, lease_seconds=0.0) is not None:
            pass
        leases.reap_expired(db)
        with db.transaction() as session:
            rows = session.execute(select(Trial.status, Trial.failures).where(Trial.study_id == study_id)).all()
        assert len(rows) == 200
        assert {(status.value, failures) for status, failures in rows} == {("failed", 2)}
    finally:
        db.dispose()
