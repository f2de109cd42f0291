"""Bad input over real HTTP: a 4xx naming the field and the reason, never a 500, never a partial
write."""

from __future__ import annotations

import httpx
import pytest

from tests.server.factories import study_spec

API = "/api/v1"


def _hp(**fields: object) -> dict:
    return {"name": "x", "role": "nuisance", "type": "float", "min": 0.1, "max": 1.0, **fields}


def _with(*hyperparameters: dict) -> dict:
    return study_spec(name="bad", hyperparameters=list(hyperparameters))


SCI = {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}

BAD_SPECS = {
    "min >= max": (_with(_hp(min=1.0, max=1.0)), "hyperparameters[0]"),
    "log with min <= 0": (_with(_hp(min=0.0, max=1.0, scale="log")), "hyperparameters[0]"),
    "reverse_log with max >= 1": (_with(_hp(min=0.5, max=1.0, scale="reverse_log")), "hyperparameters[0]"),
    "empty categorical": (
        _with({"name": "c", "role": "nuisance", "type": "categorical", "values": []}),
        "hyperparameters[0]",
    ),
    "duplicate categorical": (
        _with({"name": "c", "role": "nuisance", "type": "categorical", "values": ["a", "a"]}),
        "hyperparameters[0]",
    ),
    "unknown role": (_with(_hp(role="important")), "hyperparameters[0].role"),
    "unknown type": (_with(_hp(type="complex")), "hyperparameters[0].type"),
    "unknown scale": (_with(_hp(scale="sqrt")), "hyperparameters[0].scale"),
    "unknown algorithm": (study_spec(name="bad", algorithm="bayes-magic"), "algorithm"),
    "fixed without value": (_with({"name": "batch_size", "role": "fixed"}), "hyperparameters[0]"),
    "name twice without when": (_with(_hp(), _hp(min=0.2)), "hyperparameters[1]"),
    "when on unknown": (_with(SCI, _hp(when={"nope": ["a"]})), "hyperparameters[1].when"),
    "when on nuisance": (
        _with({"name": "c", "role": "nuisance", "type": "categorical", "values": ["a", "b"]}, _hp(when={"c": ["a"]})),
        "hyperparameters[1].when",
    ),
    "when on missing value": (_with(SCI, _hp(when={"optimizer": ["rmsprop"]})), "hyperparameters[1].when"),
    "num_trials zero": (study_spec(name="bad", num_trials=0), "num_trials"),
    "num_trials absurd": (study_spec(name="bad", num_trials=10**9), "num_trials"),
    "wrong json type": (study_spec(name="bad", num_trials="many"), "num_trials"),
    "wrong nested type": (_with(_hp(min="low")), "hyperparameters[0].min"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_spec_is_refused_with_field_and_reason(client: httpx.Client, case: str) -> None:
    spec, field = BAD_SPECS[case]
    response = client.post(f"{API}/studies", json=spec)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["field"].startswith(field) and d["reason"] for d in detail), detail
    assert client.get(f"{API}/studies").json()["total"] == 0  # nothing half-written


def test_malformed_json(client: httpx.Client) -> None:
    response = client.post(f"{API}/studies", content=b'{"name": "x",', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "body" and "JSON" in response.json()["detail"][0]["reason"]


def test_not_an_object(client: httpx.Client) -> None:
    response = client.post(f"{API}/studies", json=[1, 2])
    assert response.status_code == 422


def test_duplicate_name_is_409_and_keeps_the_first(client: httpx.Client) -> None:
    first = client.post(f"{API}/studies", json=study_spec(name="dup", num_trials=3))
    assert first.status_code == 201
    second = client.post(f"{API}/studies", json=study_spec(name="dup", num_trials=7))
    assert second.status_code == 409 and "dup" in second.json()["detail"]
    listed = client.get(f"{API}/studies").json()
    assert listed["total"] == 1 and listed["items"][0]["num_trials"] == 3


def test_oversized_payload_is_413(client: httpx.Client) -> None:
    huge = study_spec(name="huge", description="x" * (33 * 1024 * 1024))
    response = client.post(f"{API}/studies", json=huge)
    assert response.status_code == 413
    assert client.get(f"{API}/studies").json()["total"] == 0


@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "/studies/999"),
        ("patch", "/studies/999"),
        ("get", "/studies/999/trials"),
        ("get", "/trials/999"),
        ("get", "/trials/999/metrics"),
        ("post", "/trials/999/cancel"),
    ],
)
def test_unknown_ids_are_404(client: httpx.Client, method: str, path: str) -> None:
    kwargs = {"json": {"status": "paused"}} if method == "patch" else {}
    response = getattr(client, method)(f"{API}{path}", **kwargs)
    assert response.status_code == 404, response.text


def test_worker_writes_to_unknown_trial_are_404(client: httpx.Client) -> None:
    response = client.post(f"{API}/trials/999/metrics", json={"lease_id": "x", "points": []})
    assert response.status_code == 404


def test_bad_ids_and_query_values_are_422(client: httpx.Client) -> None:
    assert client.get(f"{API}/studies/abc").status_code == 422
    assert client.get(f"{API}/studies/99999999999").status_code == 422
    assert client.get(f"{API}/studies", params={"limit": 0}).status_code == 422
    assert client.get(f"{API}/studies", params={"status": "sleeping"}).status_code == 422


def test_bad_metric_points_are_refused_whole(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=study_spec(name="m", num_trials=1))
    lease = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8, "gpus": 0}}).json()
    points = [{"step": 1, "name": "train/loss", "value": 1.0}, {"step": -1, "name": "train/loss", "value": "lots"}]
    response = client.post(
        f"{API}/trials/{lease['trial_id']}/metrics", json={"lease_id": lease["lease_id"], "points": points}
    )
    assert response.status_code == 422
    fields = {d["field"] for d in response.json()["detail"]}
    assert {"points[1].step", "points[1].value"} <= fields
    assert client.get(f"{API}/trials/{lease['trial_id']}/metrics").json()["total"] == 0


def test_bad_patch_and_claim(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=study_spec(name="p", num_trials=1)).json()
    assert client.patch(f"{API}/studies/{study['id']}", json={"status": "done"}).status_code == 422
    assert client.patch(f"{API}/studies/{study['id']}", json={"num_trials": -1}).status_code == 422
    bad_claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": -1}})
    assert bad_claim.status_code == 422 and bad_claim.json()["detail"][0]["field"].startswith("resources")
    assert client.post(f"{API}/workers/claim", json={"resources": {}}).status_code == 422
