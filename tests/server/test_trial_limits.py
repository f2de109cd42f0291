"""Issue 18, item 5, over real HTTP on SQLite and Postgres: a trial token works only for its own
attempt while it runs, and a trial holds at most `HPO_MAX_POINTS_PER_TRIAL` metric points."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from hpo.server import auth
from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer

API = "/api/v1"
ONE_TRIAL = {"name": "one", "hyperparameters": [{"name": "width", "role": "fixed", "value": 8}], "max_attempts": 3}


@dataclass
class Secured:
    http: httpx.Client
    tokens: dict[str, str]

    def post(self, path: str, body: Any, token: str) -> httpx.Response:
        return self.http.post(f"{API}{path}", json=body, headers={"Authorization": f"Bearer {token}"})

    def claim(self) -> dict[str, Any]:
        answer = self.post(
            "/workers/claim", {"worker_id": "w", "resources": {"cpus": 64, "gpus": 0}}, self.tokens["worker"]
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def points(self, trial_id: int) -> list[tuple[int, float]]:
        answer = self.http.get(
            f"{API}/trials/{trial_id}/metrics", headers={"Authorization": f"Bearer {self.tokens['read']}"}
        )
        return [(p["step"], p["value"]) for p in answer.json()["items"]]


def start_server(settings: Settings, server: Any = None) -> Iterator[Secured]:
    db = Database(settings.database_url)
    db.upgrade()
    tokens = {role: auth.create_token(db, role)[1] for role in ("read", "write", "worker")}
    db.dispose()
    with LiveServer(settings, server) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        secured = Secured(http, tokens)
        created = secured.post("/studies", ONE_TRIAL, tokens["write"])
        assert created.status_code == 201, created.text
        yield secured


@pytest.fixture
def secured(settings: Settings) -> Iterator[Secured]:
    yield from start_server(settings)


def _metrics(lease: str, step: int, value: float = 1.0) -> dict[str, Any]:
    return {"lease_id": lease, "points": [{"step": step, "name": "train/loss", "value": value}]}


def _checkpoint(lease: str, step: int) -> dict[str, Any]:
    return {"lease_id": lease, "step": step, "uri": f"file:///c/{step}", "objective": 0.5}


def test_a_trial_token_works_only_while_its_attempt_runs(secured: Secured) -> None:
    first = secured.claim()
    trial, lease, token = first["trial_id"], first["lease_id"], first["trial_token"]
    assert secured.post(f"/trials/{trial}/metrics", _metrics(lease, 1), token).status_code == 200
    assert secured.post(f"/trials/{trial}/checkpoints", _checkpoint(lease, 1), token).status_code == 201
    # The attempt ends in an error and is retried: the first token is worth nothing any more.
    fail = {"lease_id": lease, "kind": "error", "reason": "boom"}
    assert secured.post(f"/trials/{trial}/fail", fail, secured.tokens["worker"]).json()["status"] == "pending"
    assert secured.post(f"/trials/{trial}/metrics", _metrics(lease, 2, 9.0), token).status_code == 409
    second = secured.claim()
    new_lease, new_token = second["lease_id"], second["trial_token"]
    assert second["trial_id"] == trial and new_lease != lease and new_token != token
    # Nor may the old token write under the new lease, which a process left over from the first
    # attempt could learn: the token names its own lease.
    refused = secured.post(f"/trials/{trial}/metrics", _metrics(new_lease, 3, 9.0), token)
    assert refused.status_code == 403 and lease in refused.json()["detail"]
    assert secured.post(f"/trials/{trial}/checkpoints", _checkpoint(new_lease, 3), token).status_code == 403
    assert secured.post(f"/trials/{trial}/metrics", _metrics(lease, 3, 9.0), token).status_code == 409
    assert secured.post(f"/trials/{trial}/metrics", _metrics(new_lease, 1, 2.0), new_token).status_code == 200
    complete = {"lease_id": new_lease}
    assert secured.post(f"/trials/{trial}/complete", complete, secured.tokens["worker"]).status_code == 200
    # Finished: the current attempt's token stops too.
    assert secured.post(f"/trials/{trial}/metrics", _metrics(new_lease, 4, 9.0), new_token).status_code == 409
    assert secured.post(f"/trials/{trial}/checkpoints", _checkpoint(new_lease, 4), new_token).status_code == 409
    assert secured.points(trial) == [(1, 2.0)]  # the second attempt's only point; nothing refused got in


def test_a_cancelled_trials_token_stops(secured: Secured) -> None:
    claim = secured.claim()
    trial, lease, token = claim["trial_id"], claim["lease_id"], claim["trial_token"]
    cancel = secured.post(f"/trials/{trial}/cancel", {}, secured.tokens["write"])
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
    assert secured.post(f"/trials/{trial}/metrics", _metrics(lease, 1), token).status_code == 409
    assert secured.points(trial) == []
