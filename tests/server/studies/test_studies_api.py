"""Study creation and the read side over real HTTP, on SQLite and Postgres."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from hpo.cli import main
from hpo.policy import ExecutionPolicy
from hpo.server.config import ServerSettings
from hpo.server.layout import quasi_random as layout
from hpo.server.spec.parse import parse_spec
from hpo.server.studies import service as studies
from hpo.server.studies.service import LIST_SPEC_BYTES, MAX_SPEC_VALUES
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.factories import study_spec

API = "/api/v1"


def _all_trials(client: httpx.Client, study_id: int) -> list[dict]:
    return client.get(f"{API}/studies/{study_id}/trials", params={"limit": 10_000}).json()["items"]


def test_design_example_creates_crossed_paired_trials(client: httpx.Client) -> None:
    response = client.post(f"{API}/studies", json=study_spec())
    assert response.status_code == 201, response.text
    study = response.json()
    assert study["status"] == "active" and study["trial_counts"]["pending"] == 2 * study["num_trials"]
    assert isinstance(study["warnings"], list)
    trials = _all_trials(client, study["id"])
    by_arm: dict[str, list[dict]] = {}
    for trial in trials:
        by_arm.setdefault(trial["arm"]["optimizer"], []).append(trial)
    assert set(by_arm) == {"nesterov", "adam"}
    for nesterov, adam in zip(by_arm["nesterov"], by_arm["adam"], strict=True):
        assert nesterov["point_index"] == adam["point_index"] and nesterov["seed"] == adam["seed"]
        assert "momentum" in nesterov["params"] and "momentum" not in adam["params"]
        assert "beta1" in adam["params"] and "beta1" not in nesterov["params"]
        assert 1e-3 <= nesterov["params"]["learning_rate"] <= 3.0
        assert 1e-5 <= adam["params"]["learning_rate"] <= 1e-1
        assert nesterov["params"]["batch_size"] == adam["params"]["batch_size"] == 128


def test_same_spec_and_seed_give_the_same_trials(client: httpx.Client) -> None:
    a = client.post(f"{API}/studies", json=study_spec(name="a")).json()
    b = client.post(f"{API}/studies", json=study_spec(name="b")).json()
    c = client.post(f"{API}/studies", json=study_spec(name="c", seed=1)).json()
    params = [[t["params"] for t in _all_trials(client, s["id"])] for s in (a, b, c)]
    assert params[0] == params[1]
    assert params[0] != params[2]


def test_raising_num_trials_continues_the_sequence(client: httpx.Client) -> None:
    small = client.post(f"{API}/studies", json=study_spec(name="grown", num_trials=5)).json()
    before = _all_trials(client, small["id"])
    patched = client.patch(f"{API}/studies/{small['id']}", json={"num_trials": 9})
    assert patched.status_code == 200, patched.text
    assert patched.json()["num_trials"] == 9
    after = _all_trials(client, small["id"])
    assert after[: len(before)] == before
    direct = client.post(f"{API}/studies", json=study_spec(name="direct", num_trials=9)).json()
    grown_params = sorted((t["point_index"], t["arm"]["optimizer"], str(t["params"])) for t in after)
    direct_params = sorted(
        (t["point_index"], t["arm"]["optimizer"], str(t["params"])) for t in _all_trials(client, direct["id"])
    )
    assert grown_params == direct_params
    shrink = client.patch(f"{API}/studies/{small['id']}", json={"num_trials": 3})
    assert shrink.status_code == 422 and shrink.json()["detail"][0]["field"] == "num_trials"


def test_manual_trials_keep_their_seeds_and_more_can_be_added(client: httpx.Client) -> None:
    spec = study_spec(
        name="manual",
        algorithm="manual",
        hyperparameters=[
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "batch_size", "role": "fixed", "value": 64},
        ],
        trials=[{"params": {"learning_rate": 0.01}, "seed": 7}, {"params": {"learning_rate": 0.1}}],
    )
    spec.pop("num_trials", None)
    response = client.post(f"{API}/studies", json=spec)
    assert response.status_code == 201, response.text
    study = response.json()
    trials = _all_trials(client, study["id"])
    assert [t["params"]["learning_rate"] for t in trials] == [0.01, 0.1]
    assert trials[0]["seed"] == 7 and trials[0]["point_index"] is None
    assert trials[0]["params"]["batch_size"] == 64
    added = client.post(
        f"{API}/studies/{study['id']}/trials", json={"trials": [{"params": {"learning_rate": 0.5}, "seed": 3}]}
    )
    assert added.status_code == 201, added.text
    assert len(_all_trials(client, study["id"])) == 3
    bad = client.post(f"{API}/studies/{study['id']}/trials", json={"trials": [{"params": {"learning_rate": 5.0}}]})
    assert bad.status_code == 422, bad.text
    assert len(_all_trials(client, study["id"])) == 3


def test_list_get_patch_archive(client: httpx.Client) -> None:
    one = client.post(f"{API}/studies", json=study_spec(name="one", num_trials=2)).json()
    two = client.post(f"{API}/studies", json=study_spec(name="two", num_trials=2)).json()
    listed = client.get(f"{API}/studies").json()
    assert listed["total"] == 2 and {s["name"] for s in listed["items"]} == {"one", "two"}
    assert client.patch(f"{API}/studies/{one['id']}", json={"status": "archived"}).json()["status"] == "archived"
    archived = client.get(f"{API}/studies", params={"status": "archived"}).json()
    assert [s["id"] for s in archived["items"]] == [one["id"]]
    assert client.get(f"{API}/studies/{two['id']}").json()["name"] == "two"
    assert (
        client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 4, "gpus": 0}}).json()[
            "study_id"
        ]
        == two["id"]
    )


def test_replicas_rerun_params_with_new_seeds(client: httpx.Client) -> None:
    study = client.post(f"{API}/studies", json=study_spec(name="rep", num_trials=1)).json()
    original = _all_trials(client, study["id"])[0]
    response = client.post(f"{API}/trials/{original['id']}/replicas", json={"count": 2})
    assert response.status_code == 201, response.text
    replicas = [client.get(f"{API}/trials/{i}").json() for i in response.json()["trial_ids"]]
    assert all(r["params"] == original["params"] and r["replica_of"] == original["id"] for r in replicas)
    assert len({original["seed"], *(r["seed"] for r in replicas)}) == 3


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "service": "hpo"}
    assert client.get("/readyz").json()["database"] == "reachable"


def test_creating_10000_trials_is_one_request(client: httpx.Client) -> None:
    response = client.post(f"{API}/studies", json=study_spec(name="big", num_trials=5000))
    assert response.status_code == 201, response.text
    assert response.json()["trial_counts"]["pending"] == 10_000


def test_prometheus_metrics_count_trials_by_status(client: httpx.Client) -> None:
    client.post(f"{API}/studies", json=study_spec(name="prom", num_trials=3))
    client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8}})
    text = client.get("/metrics").text
    assert 'hpo_trials{status="pending"} 5' in text and 'hpo_trials{status="running"} 1' in text


def test_lists_never_carry_a_large_spec_inline(
    live_server: LiveServer, client: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    big = client.post(f"{API}/studies", json=study_spec(name="big", num_trials=1, description="d" * 100_000))
    assert big.status_code == 201, big.text
    small = client.post(f"{API}/studies", json=study_spec(name="small", num_trials=1)).json()
    listed = client.get(f"{API}/studies")
    items = {s["name"]: s for s in listed.json()["items"]}
    assert items["big"]["spec"] is None and items["big"]["spec_truncated"] is True
    assert items["big"]["spec_bytes"] > LIST_SPEC_BYTES
    assert items["small"]["spec"] == small["spec"] and items["small"]["spec_truncated"] is False
    assert 0 < items["small"]["spec_bytes"] <= LIST_SPEC_BYTES
    # The description is in the item once (its own field), not a second time inside the spec.
    assert listed.text.count("d" * 100_000) == 1 and len(listed.content) < 100_000 + LIST_SPEC_BYTES
    one = client.get(f"{API}/studies", params={"limit": 1}).json()["items"]
    assert [s["name"] for s in one] == ["small"]
    # The whole spec stays one call away.
    whole = client.get(f"{API}/studies/{big.json()['id']}").json()
    assert whole["spec"]["description"] == "d" * 100_000
    # The CLI's list and the dashboard's index still show both.
    assert main(["study", "list", "--server", live_server.url]) == 0
    out = capsys.readouterr().out
    assert "big" in out and "small" in out
    index = client.get("/", headers={"Accept": "text/html"})
    assert index.status_code == 200 and "big" in index.text and "small" in index.text


def _floats_spec(name: str, floats: int, trials: int, **extra: Any) -> dict[str, Any]:
    hps = [{"name": f"p{i}", "role": "nuisance", "type": "float", "min": 0.0, "max": 1.0} for i in range(floats)]
    return {
        "name": name,
        "objective": {"metric": "loss", "mode": "min"},
        "algorithm": "halton",
        "num_trials": trials,
        "seed": 3,
        "hyperparameters": hps,
        "trainer": {"command": ["python", "train.py"]},
        **extra,
    }


def test_a_specs_cost_is_bounded_and_its_trials_are_laid_out_in_chunks(settings: Settings) -> None:
    policy = ExecutionPolicy(command_prefixes=(("python", "train.py"),))
    server = ServerSettings(max_spec_cells=150_000)
    try:
        with (
            LiveServer(dataclasses.replace(settings, execution_policy=policy), server=server) as live,
            httpx.Client(base_url=live.url, timeout=60) as http,
        ):
            # 1,000 floats x 5,000 trials (a 79 KB body) is refused at once, naming the limit.
            refused = http.post(f"{API}/studies", json=_floats_spec("huge", 1000, 5000))
            assert refused.status_code == 422, refused.text
            (error,) = refused.json()["detail"]
            assert error["field"] == "num_trials" and "HPO_MAX_SPEC_CELLS" in error["reason"]
            assert "5000 trials x 1000 hyperparameters" in error["reason"]
            # So are more listed values than MAX_SPEC_VALUES, crossed or not.
            many = [
                {"name": f"c{i}", "role": "nuisance", "type": "categorical", "values": [f"v{j}" for j in range(10_000)]}
                for i in range(MAX_SPEC_VALUES // 10_000 + 1)
            ]
            listed = http.post(f"{API}/studies", json={**_floats_spec("listed", 0, 1), "hyperparameters": many})
            assert listed.status_code == 422 and listed.json()["detail"][0]["field"] == "hyperparameters", listed.text
            assert str(MAX_SPEC_VALUES) in listed.json()["detail"][0]["reason"]
            # Within the limit: 200 floats x 600 trials, stored a chunk of points at a time, are the
            # trials one layout gives.
            spec = _floats_spec("chunked", 200, 600)
            assert 600 * 200 // layout.CHUNK_VALUES >= 2  # several chunks
            created = http.post(f"{API}/studies", json=spec)
            assert created.status_code == 201, created.text
            stored = _all_trials(http, created.json()["id"])
            expected = layout.layout_trials(parse_spec(spec), 0, 600)
            assert [t["params"] for t in stored] == [d.params for d in expected]
            assert [t["point_index"] for t in stored] == list(range(600))
            # Growing past the limit is refused too; growing within it continues the sequence.
            grown = http.patch(f"{API}/studies/{created.json()['id']}", json={"num_trials": 1000})
            assert grown.status_code == 422 and "HPO_MAX_SPEC_CELLS" in grown.text, grown.text
            grown = http.patch(f"{API}/studies/{created.json()['id']}", json={"num_trials": 700})
            assert grown.status_code == 200, grown.text
            more = _all_trials(http, created.json()["id"])
            assert [t["params"] for t in more] == [d.params for d in layout.layout_trials(parse_spec(spec), 0, 700)]
    finally:
        studies.configure(studies.MAX_SPEC_CELLS)  # the module's default, for tests that follow
