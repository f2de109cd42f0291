"""The worker protocol over real HTTP, on SQLite and Postgres: claims, fencing leases, metrics,
checkpoints, completion, failure with retries, preemption and resume, cancellation, the reaper."""

from __future__ import annotations

import time

import httpx

from hpo.server.db import Database
from hpo.server.trials import leases
from tests.server.factories import study_spec

API = "/api/v1"


def make_study(client: httpx.Client, **overrides: object) -> dict:
    response = client.post(f"{API}/studies", json=study_spec(**overrides))
    assert response.status_code == 201, response.text
    return response.json()


def claim(client: httpx.Client, worker: str = "w1", cpus: float = 8, gpus: float = 0) -> httpx.Response:
    return client.post(f"{API}/workers/claim", json={"worker_id": worker, "resources": {"cpus": cpus, "gpus": gpus}})


def small_spec(**overrides: object) -> dict:
    base = {
        "name": "protocol",
        "num_trials": 2,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "batch_size", "role": "fixed", "value": 32},
        ],
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
        "max_attempts": 2,
    }
    base.update(overrides)
    return study_spec(**base)


def test_claim_answers_full_config_and_new_lease_each_time(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=small_spec()).json()
    first = claim(client).json()
    second = claim(client).json()
    assert claim(client).status_code == 204
    assert {first["trial_id"], second["trial_id"]} == {t["id"] for t in _trials(client, study["id"])}
    assert first["lease_id"] != second["lease_id"]
    config = first["config"]
    assert set(config) == {"params", "trainer", "seed", "objective", "resources"}
    assert config["params"]["batch_size"] == 32 and 1e-4 <= config["params"]["learning_rate"] <= 1.0
    assert config["objective"] == {"metric": "valid/error_rate", "mode": "min"}
    assert first["attempt"] == 1 and first["resume_from"] is None
    assert first["artifact_path"] == f"trials/{first['trial_id']}/attempt-1"


def test_claim_respects_offered_resources(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(resources={"workers": 2, "cpus_per_worker": 2, "gpus_per_worker": 1}))
    assert claim(client, cpus=3, gpus=2).status_code == 204
    assert claim(client, cpus=4, gpus=1).status_code == 204
    assert claim(client, cpus=4, gpus=2).status_code == 200


def test_metrics_are_idempotent_and_keep_non_finite_values(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec())
    lease = claim(client).json()
    tid, lid = lease["trial_id"], lease["lease_id"]
    points = [
        {"step": 100, "name": "valid/error_rate", "value": 0.5},
        {"step": 200, "name": "valid/error_rate", "value": 0.3},
        {"step": 300, "name": "valid/error_rate", "value": "NaN"},
        {"step": 300, "name": "train/loss", "value": "Infinity"},
        {"step": 301, "name": "train/loss", "value": "-Infinity"},
    ]
    for _ in range(2):  # a replayed batch must not duplicate anything
        answer = client.post(f"{API}/trials/{tid}/metrics", json={"lease_id": lid, "points": points})
        assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": 5, "objective_value": 0.3, "best_step": 200}
    stored = client.get(f"{API}/trials/{tid}/metrics").json()
    assert stored["total"] == 5
    values = {(p["name"], p["step"]): p["value"] for p in stored["items"]}
    assert values[("valid/error_rate", 300)] == "NaN"
    assert values[("train/loss", 300)] == "Infinity" and values[("train/loss", 301)] == "-Infinity"
    trial = client.get(f"{API}/trials/{tid}").json()
    assert trial["objective_value"] == 0.3 and trial["best_step"] == 200


def test_json_nan_literals_are_accepted(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec())
    lease = claim(client).json()
    points = '[{"step": 1, "name": "train/loss", "value": NaN}]'
    body = f'{{"lease_id": "{lease["lease_id"]}", "points": {points}}}'
    answer = client.post(
        f"{API}/trials/{lease['trial_id']}/metrics", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    assert client.get(f"{API}/trials/{lease['trial_id']}/metrics").json()["items"][0]["value"] == "NaN"


def test_objective_respects_max_mode(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(objective={"metric": "valid/accuracy", "mode": "max"}))
    lease = claim(client).json()
    points = [{"step": s, "name": "valid/accuracy", "value": v} for s, v in [(1, 0.2), (2, 0.9), (3, 0.9), (4, 0.4)]]
    answer = client.post(
        f"{API}/trials/{lease['trial_id']}/metrics", json={"lease_id": lease["lease_id"], "points": points}
    )
    assert answer.json()["objective_value"] == 0.9 and answer.json()["best_step"] == 2


def test_stale_lease_writes_get_409_and_change_nothing(client: httpx.Client, settings: object) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=1))
    lease = claim(client).json()
    tid = lease["trial_id"]
    stale = {"lease_id": "not-the-lease", "points": [{"step": 1, "name": "train/loss", "value": 1.0}]}
    assert client.post(f"{API}/trials/{tid}/metrics", json=stale).status_code == 409
    assert client.post(f"{API}/trials/{tid}/heartbeat", json={"lease_id": "nope"}).status_code == 409
    assert client.post(f"{API}/trials/{tid}/complete", json={"lease_id": "nope"}).status_code == 409
    assert (
        client.post(f"{API}/trials/{tid}/checkpoints", json={"lease_id": "x", "step": 1, "uri": "u"}).status_code == 409
    )
    assert client.get(f"{API}/trials/{tid}/metrics").json()["total"] == 0
    assert client.get(f"{API}/trials/{tid}").json()["status"] == "running"


def test_complete_is_final(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=1))
    lease = claim(client).json()
    tid, lid = lease["trial_id"], lease["lease_id"]
    assert client.post(f"{API}/trials/{tid}/complete", json={"lease_id": lid}).status_code == 200
    assert client.post(f"{API}/trials/{tid}/complete", json={"lease_id": lid}).status_code == 409
    points = {"lease_id": lid, "points": [{"step": 1, "name": "train/loss", "value": 1.0}]}
    assert client.post(f"{API}/trials/{tid}/metrics", json=points).status_code == 409
    assert client.post(f"{API}/trials/{tid}/cancel").status_code == 409
    study = client.get(f"{API}/studies/{lease['study_id']}").json()
    assert study["status"] == "completed" and study["trial_counts"]["completed"] == 1


def test_error_is_retried_from_scratch_then_fails(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=1, max_attempts=2, max_failed_trials=10))
    first = claim(client).json()
    tid = first["trial_id"]
    client.post(
        f"{API}/trials/{tid}/metrics",
        json={"lease_id": first["lease_id"], "points": [{"step": 5, "name": "train/loss", "value": 2.0}]},
    )
    client.post(f"{API}/trials/{tid}/checkpoints", json={"lease_id": first["lease_id"], "step": 5, "uri": "ck5"})
    answer = client.post(
        f"{API}/trials/{tid}/fail", json={"lease_id": first["lease_id"], "kind": "error", "reason": "boom"}
    )
    assert answer.json() == {"status": "pending"}
    second = claim(client).json()
    assert second["trial_id"] == tid and second["attempt"] == 2
    assert second["resume_from"] is None  # an error restarts from scratch
    assert client.get(f"{API}/trials/{tid}/metrics").json()["total"] == 0
    answer = client.post(
        f"{API}/trials/{tid}/fail", json={"lease_id": second["lease_id"], "kind": "error", "reason": "boom"}
    )
    assert answer.json() == {"status": "failed"}
    trial = client.get(f"{API}/trials/{tid}").json()
    assert trial["status"] == "failed" and trial["error"] == "boom" and trial["fail_kind"] == "error"


def test_infeasible_and_config_failures_are_final(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=2, max_failed_trials=10))
    a, b = claim(client).json(), claim(client).json()
    infeasible = {"lease_id": a["lease_id"], "kind": "infeasible", "reason": "loss is NaN", "step": 40}
    assert client.post(f"{API}/trials/{a['trial_id']}/fail", json=infeasible).json() == {"status": "infeasible"}
    config = {"lease_id": b["lease_id"], "kind": "config", "reason": "unknown optimizer 'adamx'"}
    assert client.post(f"{API}/trials/{b['trial_id']}/fail", json=config).json() == {"status": "failed"}
    assert claim(client).status_code == 204
    trial = client.get(f"{API}/trials/{a['trial_id']}").json()
    assert trial["error_step"] == 40 and trial["fail_kind"] == "infeasible"


def test_preempted_resumes_from_newest_checkpoint_without_using_an_attempt(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=1, max_attempts=1))
    first = claim(client).json()
    tid, lid = first["trial_id"], first["lease_id"]
    points = [{"step": s, "name": "valid/error_rate", "value": 1.0 / s} for s in (100, 200, 300)]
    client.post(f"{API}/trials/{tid}/metrics", json={"lease_id": lid, "points": points})
    for step in (100, 200):
        client.post(
            f"{API}/trials/{tid}/checkpoints",
            json={"lease_id": lid, "step": step, "uri": f"ck{step}", "objective": 1.0 / step},
        )
    answer = client.post(f"{API}/trials/{tid}/fail", json={"lease_id": lid, "kind": "preempted"})
    assert answer.json() == {"status": "pending"}
    second = claim(client).json()
    assert second["trial_id"] == tid and second["attempt"] == 2
    assert second["resume_from"] == {"step": 200, "uri": "ck200", "attempt": 1}
    steps = sorted(p["step"] for p in client.get(f"{API}/trials/{tid}/metrics").json()["items"])
    assert steps == [100, 200]  # points past the resume step are gone: no duplicate on replay
    assert client.get(f"{API}/trials/{tid}").json()["best_step"] == 200


def test_heartbeat_extends_and_says_stop_on_pause_and_cancel(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=small_spec(num_trials=2)).json()
    a, b = claim(client).json(), claim(client).json()
    beat = client.post(f"{API}/trials/{a['trial_id']}/heartbeat", json={"lease_id": a["lease_id"]}).json()
    assert beat["should_stop"] is False and beat["lease_expires_at"] >= a["lease_expires_at"]
    client.post(f"{API}/trials/{b['trial_id']}/cancel")
    beat = client.post(f"{API}/trials/{b['trial_id']}/heartbeat", json={"lease_id": b["lease_id"]}).json()
    assert beat["should_stop"] is True
    client.patch(f"{API}/studies/{study['id']}", json={"status": "paused"})
    beat = client.post(f"{API}/trials/{a['trial_id']}/heartbeat", json={"lease_id": a["lease_id"]}).json()
    assert beat["should_stop"] is True


def test_paused_study_is_not_claimed_until_resumed(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=small_spec(num_trials=1)).json()
    client.patch(f"{API}/studies/{study['id']}", json={"status": "paused"})
    assert claim(client).status_code == 204
    client.patch(f"{API}/studies/{study['id']}", json={"status": "active"})
    assert claim(client).status_code == 200


def test_consecutive_errors_pause_the_study(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=small_spec(num_trials=5, max_attempts=1, max_failed_trials=2)).json()
    for _ in range(2):
        lease = claim(client).json()
        client.post(
            f"{API}/trials/{lease['trial_id']}/fail",
            json={"lease_id": lease["lease_id"], "kind": "error", "reason": "x"},
        )
    assert client.get(f"{API}/studies/{study['id']}").json()["status"] == "paused"
    assert claim(client).status_code == 204


def test_expired_lease_is_reaped_requeued_and_fenced(database_url: str) -> None:
    db = Database(database_url)
    db.upgrade()
    from hpo.server.studies import service as studies

    studies.create_study(db, small_spec(num_trials=1, max_attempts=2))
    first = leases.claim(db, "w1", 8, 0, lease_seconds=0.2)
    assert first is not None
    time.sleep(0.5)
    second = leases.claim(db, "w2", 8, 0, lease_seconds=0.2)
    assert second is not None and second.trial_id == first.trial_id and second.attempt == 2
    try:
        leases.complete(db, first.trial_id, first.lease_id)
        raise AssertionError("a stale lease completed the trial")
    except leases.LeaseLost:
        pass
    time.sleep(0.5)
    assert leases.reap_expired(db) == 1  # second expiry uses up the last attempt
    from hpo.server.trials import reads as trials

    trial = trials.get_trial(db, first.trial_id)
    assert trial.status == "failed" and "lease expired" in (trial.error or "")
    db.dispose()


def test_trials_list_filters_pages_and_orders_by_objective(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=small_spec(num_trials=4)).json()
    values = [0.4, 0.1, 0.3]
    for value in values:
        lease = claim(client).json()
        point = [{"step": 10, "name": "valid/error_rate", "value": value}]
        client.post(f"{API}/trials/{lease['trial_id']}/metrics", json={"lease_id": lease["lease_id"], "points": point})
        client.post(f"{API}/trials/{lease['trial_id']}/complete", json={"lease_id": lease["lease_id"]})
    page = client.get(f"{API}/studies/{study['id']}/trials", params={"order_by": "objective", "limit": 2}).json()
    assert page["total"] == 4 and [t["objective_value"] for t in page["items"]] == [0.1, 0.3]
    rest = client.get(f"{API}/studies/{study['id']}/trials", params={"order_by": "objective", "offset": 2}).json()
    assert [t["objective_value"] for t in rest["items"]] == [0.4, None]
    pending = client.get(f"{API}/studies/{study['id']}/trials", params={"status": "pending"}).json()
    assert pending["total"] == 1 and pending["items"][0]["status"] == "pending"
    shown = client.get(f"{API}/studies/{study['id']}").json()
    assert shown["best_value"] == 0.1 and shown["trial_counts"]["completed"] == 3


def _trials(client: httpx.Client, study_id: int) -> list[dict]:
    return client.get(f"{API}/studies/{study_id}/trials", params={"limit": 1000}).json()["items"]


def test_nan_never_reaches_the_objective(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=small_spec(num_trials=1))
    lease = claim(client).json()
    points = [
        {"step": 1, "name": "valid/error_rate", "value": "NaN"},
        {"step": 2, "name": "valid/error_rate", "value": "-Infinity"},
    ]
    answer = client.post(
        f"{API}/trials/{lease['trial_id']}/metrics", json={"lease_id": lease["lease_id"], "points": points}
    )
    assert answer.json()["objective_value"] is None
