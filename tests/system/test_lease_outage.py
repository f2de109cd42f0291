"""An outage longer than the lease costs no live worker its trial: when the database is back, the
reaper first gives every running lease a lease period from then, so the workers' retried heartbeats
land before anything is reaped; a worker that is really gone is reaped a lease period later
(docs/workers.md, "Database outages")."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from hpo.server.db import Database
from hpo.server.models import Trial
from hpo.server.studies import service as studies
from hpo.server.trials import leases
from tests.server.trials.test_protocol import small_spec
from tests.system import test_outage
from tests.system.test_outage import Relay, _server, _wait_for

relayed = test_outage.relayed  # the fixture: Postgres behind a relay that can be cut
LEASE = 2.0


def _remaining(db: Database, trial_id: int) -> float:
    """Seconds left on the trial's lease by the database clock."""
    with db.transaction() as session:
        return float(session.scalar(select(Trial.lease_expires_at - db.now_seconds()).where(Trial.id == trial_id)))


def _trial(db: Database, trial_id: int) -> tuple[str, int]:
    with db.transaction() as session:
        trial = session.get_one(Trial, trial_id)
        return trial.status.value, trial.failures


def test_after_an_outage_leases_get_a_lease_period_before_anything_is_reaped(database_url: str) -> None:
    # Two server processes' reapers on one database.
    servers = [Database(database_url), Database(database_url)]
    servers[0].upgrade()
    try:
        studies.create_study(servers[0], small_spec(num_trials=2, max_attempts=3))
        alive = leases.claim(servers[0], "alive", 8, 0, lease_seconds=LEASE)
        gone = leases.claim(servers[1], "gone", 8, 0, lease_seconds=LEASE)
        assert alive is not None and gone is not None
        assert [leases.reap_expired(db) for db in servers] == [0, 0]
        # The outage: no reaper reaches the database for longer than a lease, and no heartbeat does.
        time.sleep(LEASE + 1.0)
        assert _remaining(servers[0], alive.trial_id) < 0  # both leases ran out meanwhile
        # Back: each reaper passes and reaps nothing. Each extended the leases, to a lease period
        # from now and not two: the extension does not add up over processes.
        assert [leases.reap_expired(db) for db in servers] == [0, 0]
        for trial in (alive, gone):
            assert LEASE - 0.5 < _remaining(servers[0], trial.trial_id) <= LEASE + 0.05
        # The live worker's retried heartbeat lands and keeps its trial.
        time.sleep(LEASE / 2)
        answer = leases.heartbeat(servers[0], alive.trial_id, alive.lease_id, LEASE)
        assert not answer.should_stop
        # With the reapers passing as usual (every quarter lease), the worker that is gone is
        # reaped once its extended lease runs out; the live one, heartbeating, never is.
        deadline = time.monotonic() + 3 * LEASE
        reaped = 0
        while reaped == 0 and time.monotonic() < deadline:
            time.sleep(LEASE / 4)
            leases.heartbeat(servers[0], alive.trial_id, alive.lease_id, LEASE)
            reaped += sum(leases.reap_expired(db) for db in servers)
        assert reaped == 1
        assert _trial(servers[0], gone.trial_id) == ("pending", 1)
        assert _trial(servers[0], alive.trial_id) == ("running", 0)
    finally:
        for db in servers:
            db.dispose()


def test_without_an_outage_an_expired_lease_is_reaped_at_once(database_url: str) -> None:
    """The extension is for outages only: a reaper that passes every quarter lease reaps a lapsed
    lease at its next pass."""
    db = Database(database_url)
    db.upgrade()
    try:
        studies.create_study(db, small_spec(num_trials=1, max_attempts=3))
        gone = leases.claim(db, "gone", 8, 0, lease_seconds=LEASE)
        assert gone is not None
        reaped, passes = 0, 0
        while reaped == 0 and passes < 8:
            time.sleep(LEASE / 4)
            passes += 1
            reaped = leases.reap_expired(db)
        assert reaped == 1 and passes <= 6  # within a pass of the lease's end (4 passes, plus slack)
    finally:
        db.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_real_outage_longer_than_the_lease_reaps_no_live_worker(
    relayed: tuple[Relay, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `hpo server` (leases of 3 s) loses Postgres for 6 s: the heartbeat a worker sends a
    second and a half after the database is back holds its lease; the lease of a worker that never
    heartbeats is reaped a lease period after that."""
    relay, url = relayed
    monkeypatch.setenv("HPO_LEASE_SECONDS", "3")
    server, base, log = _server(url, tmp_path)
    try:
        _wait_for(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "the server")
        assert httpx.post(f"{base}/api/v1/studies", json=small_spec(num_trials=2), timeout=30).status_code == 201
        claims = [
            httpx.post(f"{base}/api/v1/workers/claim", json={"worker_id": w, "resources": {"cpus": 8}}, timeout=30)
            for w in ("alive", "gone")
        ]
        alive, gone = (answer.json() for answer in claims)
        relay.cut()
        time.sleep(6.0)
        relay.start()
        back = time.monotonic()
        _wait_for(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "the database")
        time.sleep(max(0.0, back + 1.5 - time.monotonic()))  # two reaper passes (every 0.75 s) meanwhile
        beat = lambda: httpx.post(  # noqa: E731
            f"{base}/api/v1/trials/{alive['trial_id']}/heartbeat", json={"lease_id": alive["lease_id"]}, timeout=10
        )
        _wait_for(lambda: beat().status_code != 503, "a heartbeat past the outage")  # a pooled connection died
        answer = beat()
        assert answer.status_code == 200, answer.text
        # The worker that is gone: reaped within a lease and a pass or two of the extension.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert beat().status_code == 200
            if httpx.get(f"{base}/api/v1/trials/{gone['trial_id']}", timeout=10).json()["status"] == "pending":
                break
            time.sleep(0.5)
        trials = {
            t: httpx.get(f"{base}/api/v1/trials/{t}", timeout=10).json() for t in (alive["trial_id"], gone["trial_id"])
        }
        assert trials[gone["trial_id"]]["status"] == "pending"
        assert trials[alive["trial_id"]]["status"] == "running"
        lines = log.read_text().splitlines()
        assert any("lease reaper: the database was out of reach" in line for line in lines), "\n".join(lines)
        assert not [line for line in lines if "Traceback" in line], "\n".join(lines)
    finally:
        server.terminate()
        server.wait(30)
