"""Limits on what a trial may write (docs/security.md, "Trial tokens"), over real HTTP on SQLite and
Postgres: a trial token works only for its own attempt while it runs, and a trial holds at most
`HPO_MAX_POINTS_PER_TRIAL` metric points."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from hpo.server.auth import tokens as auth
from hpo.server.config import ServerSettings
from hpo.server.db import Database
from hpo.settings import Settings, SettingsError
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


# --- the metric quota ----------------------------------------------------------------------------


@pytest.fixture
def quota_of_10(settings: Settings) -> Iterator[Secured]:
    yield from start_server(settings, ServerSettings(max_points_per_trial=10))


def _batch(lease: str, steps: range, value: float = 1.0) -> dict[str, Any]:
    return {"lease_id": lease, "points": [{"step": s, "name": "train/loss", "value": value} for s in steps]}


def _stored_count(settings: Settings, trial: int) -> tuple[int | None, int]:
    """(the trial's kept count, the points really stored)."""
    db = Database(settings.database_url)
    with db.transaction() as session:
        kept = session.execute(text("SELECT point_count FROM trials WHERE id = :id"), {"id": trial}).scalar()
        rows = session.execute(text("SELECT count(*) FROM metric_points WHERE trial_id = :id"), {"id": trial}).scalar()
    db.dispose()
    return kept, int(rows or 0)


def test_a_trial_holds_at_most_the_quota_of_points(quota_of_10: Secured, settings: Settings) -> None:
    secured = quota_of_10
    claim = secured.claim()
    trial, lease, token = claim["trial_id"], claim["lease_id"], claim["trial_token"]
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(1, 7)), token).status_code == 200
    # A replay overwrites and counts nothing again.
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(1, 7), 2.0), token).status_code == 200
    # 6 held + 5 new > 10: refused whole, the replayed step 6 of the batch included.
    over = secured.post(f"/trials/{trial}/metrics", _batch(lease, range(6, 12), 3.0), token)
    assert over.status_code == 413, over.text
    detail = over.json()["detail"]
    assert "11 metric points" in detail and "limit of 10" in detail and "HPO_MAX_POINTS_PER_TRIAL" in detail
    assert secured.points(trial) == [(s, 2.0) for s in range(1, 7)]
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(7, 11)), token).status_code == 200
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(11, 12)), token).status_code == 413
    assert _stored_count(settings, trial) == (10, 10)
    # A resumed attempt's cut history frees its room: resumed at step 3, points 4-10 go.
    checkpoint = {"lease_id": lease, "step": 3, "uri": "file:///c/3", "objective": None}
    assert secured.post(f"/trials/{trial}/checkpoints", checkpoint, token).status_code == 201
    preempted = {"lease_id": lease, "kind": "preempted", "reason": ""}
    assert secured.post(f"/trials/{trial}/fail", preempted, secured.tokens["worker"]).status_code == 200
    resumed = secured.claim()
    assert resumed["resume_from"]["step"] == 3 and _stored_count(settings, trial) == (3, 3)
    lease, token = resumed["lease_id"], resumed["trial_token"]
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(4, 11)), token).status_code == 200
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(11, 12)), token).status_code == 413
    # A trial from before points were counted (NULL) is counted at its next write.
    db = Database(settings.database_url)
    with db.transaction() as session:
        session.execute(text("UPDATE trials SET point_count = NULL WHERE id = :id"), {"id": trial})
    db.dispose()
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(11, 12)), token).status_code == 413
    assert secured.post(f"/trials/{trial}/metrics", _batch(lease, range(1, 3), 5.0), token).status_code == 200
    assert _stored_count(settings, trial) == (10, 10)


def test_the_quota_setting_is_checked() -> None:
    with pytest.raises(SettingsError, match="HPO_MAX_POINTS_PER_TRIAL must be a whole number, got '1e6'"):
        ServerSettings.from_env({"HPO_MAX_POINTS_PER_TRIAL": "1e6"})
    with pytest.raises(SettingsError, match="HPO_MAX_POINTS_PER_TRIAL must be between 1 and"):
        ServerSettings.from_env({"HPO_MAX_POINTS_PER_TRIAL": "0"})
    assert ServerSettings.from_env({"HPO_MAX_POINTS_PER_TRIAL": "20_000_000"}).max_points_per_trial == 20_000_000
