"""A worker that cannot write its artifact root (docs/workers.md, "Worker health"): it reports
itself on `/metrics` and the dashboard, and the trial it could not run is returned as if never
claimed. Over real HTTP, on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx

API = "/api/v1"


def _study(client: httpx.Client) -> dict[str, Any]:
    spec = {
        "name": "returned",
        "num_trials": 1,
        "max_attempts": 3,
        "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 0.01, "max": 0.1}],
        "trainer": {"workload": "synthetic_mlp", "max_train_steps": 20, "eval_every_steps": 10},
    }
    response = client.post(f"{API}/studies", json=spec)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _claim(client: httpx.Client) -> dict[str, Any]:
    response = client.post(f"{API}/workers/claim", json={"worker_id": "w1", "resources": {"cpus": 8, "gpus": 0}})
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_returned_attempt_leaves_the_trial_as_before_its_claim(client: httpx.Client) -> None:
    _study(client)
    first = _claim(client)
    trial_id, lease = first["trial_id"], first["lease_id"]
    before = client.get(f"{API}/trials/{trial_id}").json()
    points = [{"step": s, "name": "valid/error_rate", "value": 0.5} for s in (10, 20)]
    assert client.post(f"{API}/trials/{trial_id}/metrics", json={"lease_id": lease, "points": points}).is_success
    checkpoint = {"lease_id": lease, "step": 10, "uri": f"trials/{trial_id}/attempt-1/checkpoints/step-10.pt"}
    assert client.post(f"{API}/trials/{trial_id}/checkpoints", json=checkpoint).is_success
    reason = "cannot write the artifact root /a (No space left on device; 0 MiB free)\n\nOSError: ..."
    answer = client.post(
        f"{API}/trials/{trial_id}/fail", json={"lease_id": lease, "kind": "returned", "reason": reason}
    )
    assert answer.json()["status"] == "pending", answer.text
    after = client.get(f"{API}/trials/{trial_id}").json()
    assert after["attempt"] == before["attempt"] - 1 == 0, after
    assert after["error"] is None and after["fail_kind"] is None and after["status"] == "pending", after
    assert after["objective_value"] is None, "the returned attempt's points still count"
    metrics = client.get(f"{API}/trials/{trial_id}/metrics", params={"name": "valid/error_rate"}).json()["items"]
    assert metrics == []
    assert client.get(f"{API}/trials/{trial_id}/checkpoints").json() == []
    again = _claim(client)
    assert (again["trial_id"], again["attempt"], again.get("resume_from")) == (trial_id, 1, None)
    # A returned attempt is no failure: the lease is gone like any other ended one.
    stale = client.post(f"{API}/trials/{trial_id}/fail", json={"lease_id": lease, "kind": "returned"})
    assert stale.status_code == 409, stale.text


def test_a_workers_health_is_on_metrics_and_the_dashboard(client: httpx.Client) -> None:
    why = 'cannot write the artifact root /mnt/a (Read-only file system; 4 MiB free) <b>"x"</b>'
    for worker, healthy, reason in (("gpu-node-7", False, why), ("gpu-node-8", True, "")):
        body = {"worker_id": worker, "healthy": healthy, "reason": reason}
        assert client.post(f"{API}/workers/health", json=body).status_code == 204
    assert client.post(f"{API}/workers/health", json={"worker_id": "", "healthy": True}).status_code == 422
    assert client.post(f"{API}/workers/health", json={"worker_id": "w", "healthy": "no"}).status_code == 422
    metrics = client.get("/metrics").text
    assert 'hpo_worker_healthy{worker="gpu-node-7"} 0' in metrics
    assert 'hpo_worker_healthy{worker="gpu-node-8"} 1' in metrics
    # A newer report replaces the older one.
    assert client.post(f"{API}/workers/health", json={"worker_id": "gpu-node-7", "healthy": True}).status_code == 204
    assert 'hpo_worker_healthy{worker="gpu-node-7"} 1' in client.get("/metrics").text
    client.post(f"{API}/workers/health", json={"worker_id": "gpu-node-7", "healthy": False, "reason": why})
    page = client.get("/").text
    assert 'id="worker-health"' in page and "not claiming" in page
    assert "Read-only file system" in page and "<b>" not in page, "the reason is text, escaped"
