"""A bayesian study over HTTP: 422s naming the field, a live server whose background refiller
(in its child process) fills the queue while claims answer 204 at once, and the analysis's
`bayesian` key; warm start from an exploration study."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from hpo.server.bayesian import queue
from hpo.server.db import Database
from hpo.server.errors import InvalidInput
from hpo.server.models import BayesianState
from hpo.server.studies import service as studies
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.bayesian.helpers import bayesian_spec, run_one

CLAIM = {"worker_id": "w", "resources": {"cpus": 4, "gpus": 0}}


def _errors(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["field"]: e["reason"] for e in response.json()["detail"]}


def test_bad_bayesian_specs_get_422_naming_the_field(client: httpx.Client) -> None:
    continuous_scientific = bayesian_spec()
    continuous_scientific["hyperparameters"][0]["role"] = "scientific"
    errors = _errors(client.post("/api/v1/studies", json=continuous_scientific))
    assert "make it nuisance" in errors["hyperparameters[0].role"]

    halton_with_block = {**bayesian_spec(initial_trials=2), "algorithm": "halton"}
    assert "only for algorithm" in _errors(client.post("/api/v1/studies", json=halton_with_block))["bayesian"]

    too_many = bayesian_spec(num_trials=4, initial_trials=9)
    assert "at most num_trials" in _errors(client.post("/api/v1/studies", json=too_many))["bayesian.initial_trials"]
    unknown = bayesian_spec(queue_sise=3)
    assert "not a known field" in _errors(client.post("/api/v1/studies", json=unknown))["bayesian.queue_sise"]
    missing = bayesian_spec(warm_start={"study_ids": [999]})
    assert "names no study" in _errors(client.post("/api/v1/studies", json=missing))["bayesian.warm_start.study_ids[0]"]


def test_the_refiller_fills_the_queue_in_the_background_and_claims_never_wait(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=database_url, artifact_root=tmp_path / "a", lease_seconds=60)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        # A queue of one behind three Halton trials: the queue runs short only when the third is
        # claimed, with two results in, so the first proposal is the model's. (With a queue as long
        # as the initial design, claiming the first Halton trial already asks for a proposal, which
        # continues the quasi-random design without a model: a race with the test's worker.)
        created = http.post("/api/v1/studies", json=bayesian_spec(num_trials=6, initial_trials=3, queue_size=1))
        study_id = created.json()["id"]
        db = Database(database_url)
        for _ in range(3):  # the three Halton trials, finished by a worker
            assert run_one(db) is not None
        got, empty, slowest = None, 0, 0.0
        deadline = time.monotonic() + 120  # the first fit spawns the child process and imports torch
        while got is None and time.monotonic() < deadline:
            start = time.perf_counter()
            response = http.post("/api/v1/workers/claim", json=CLAIM)
            slowest = max(slowest, time.perf_counter() - start)
            if response.status_code == 200:
                got = response.json()
            else:
                assert response.status_code == 204
                empty += 1
                time.sleep(0.1)
        assert got is not None and got["study_id"] == study_id
        assert empty > 0  # the queue was empty while the model was fitted ...
        assert slowest < 2.0  # ... and those claims answered at once instead of waiting for the fit
        assert 1e-4 <= got["config"]["params"]["learning_rate"] <= 1.0

        analysis = http.get(f"/api/v1/studies/{study_id}/analysis").json()["bayesian"]
        assert [p["source"] for p in analysis["best_so_far"]] == ["initial", "initial", "initial"]
        assert analysis["best_so_far"][-1]["best"] == min(p["value"] for p in analysis["best_so_far"])
        assert analysis["proposals"] >= 1
        assert [s["name"] for s in analysis["model"]["slices"]] == ["learning_rate", "weight_decay"]
        db.dispose()


def test_warm_start_seeds_the_model_with_the_exploration_study(db: Database) -> None:
    exploration = bayesian_spec(name="explore", num_trials=8)
    exploration.pop("bayesian", None)
    exploration["algorithm"] = "halton"
    exploration["hyperparameters"].append(
        {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["adam", "sgd"]}
    )
    explore = studies.create_study(db, exploration)
    while run_one(db) is not None:
        pass

    narrowed = bayesian_spec(name="exploit", num_trials=10, warm_start={"study_ids": [explore.id]})
    narrowed["hyperparameters"][0].update(min=1e-3, max=1e-1)
    narrowed["hyperparameters"].append({"name": "optimizer", "role": "fixed", "value": "adam"})
    exploit = studies.create_study(db, narrowed)
    with db.transaction() as session:
        state = session.get_one(BayesianState, exploit.id)
        warm = state.warm[queue.arm_key({})]
    explored = [t for t in studies_trials(db, explore.id) if t["optimizer"] == "adam"]
    inside = [t for t in explored if 1e-3 <= t["learning_rate"] <= 1e-1]
    assert 0 < len(warm) == len(inside) < 8
    assert all(0.0 <= u <= 1.0 for point, _ in warm for u in point)
    # max(5, 2 x 2) initial trials, less the warm observations
    assert state.initial_trials == max(0, 5 - len(warm))

    wider = bayesian_spec(name="wider", warm_start={"study_ids": [explore.id]})
    wider["hyperparameters"][0].update(min=1e-5)
    wider["hyperparameters"].append({"name": "optimizer", "role": "fixed", "value": "adam"})
    with pytest.raises(InvalidInput) as refused:
        studies.create_study(db, wider)
    [error] = refused.value.errors
    assert error.field == "bayesian.warm_start.study_ids[0]"
    assert "'learning_rate' range [1e-05, 1.0] here is not inside [0.0001, 1.0] there" in error.reason


def studies_trials(db: Database, study_id: int) -> list[dict]:
    from hpo.server.trials import reads as trials

    return [t.params for t in trials.list_trials(db, study_id, limit=1000).items]
