"""Charts over a conditional space (docs/dashboard.md, "Charts"): a learning rate per optimizer,
where Adam's learning rate drives the objective and everything else is flat. Planted trials through
the worker protocol over HTTP, on SQLite and Postgres."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, grad_norms, run_pending
from tests.server.analysis.test_planted import TRAINER

ADAM_LR = (1e-5, 1e-1)
SGD_LR = (1e-3, 3.0)
ADAM = "learning_rate (optimizer=adam)"
SGD = "learning_rate (optimizer=sgd)"


def conditional_spec(num_trials: int = 16) -> dict[str, Any]:
    return {
        "name": "conditional",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "algorithm": "halton",
        "num_trials": num_trials,
        "seed": 0,
        "hyperparameters": [
            {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]},
            {
                "name": "learning_rate",
                "role": "nuisance",
                "type": "float",
                "min": SGD_LR[0],
                "max": SGD_LR[1],
                "scale": "log",
                "when": {"optimizer": ["sgd"]},
            },
            {
                "name": "learning_rate",
                "role": "nuisance",
                "type": "float",
                "min": ADAM_LR[0],
                "max": ADAM_LR[1],
                "scale": "log",
                "when": {"optimizer": ["adam"]},
            },
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
            {"name": "batch_size", "role": "fixed", "value": 128},
        ],
        "trainer": TRAINER,
        "resources": {"workers": 1, "gpus_per_worker": 0, "cpus_per_worker": 1},
    }


def adam_lr_drives(config: dict[str, Any]) -> Outcome:
    """Adam: a steep valley in log10(learning rate) (0.10 at 1e-3 up to 0.70 at the ends); SGD: a
    flat 0.35 whatever its learning rate. Weight decay never matters."""
    params = config["params"]
    adam = params["optimizer"] == "adam"
    level = 0.1 + 0.15 * (math.log10(params["learning_rate"]) + 3.0) ** 2 if adam else 0.35
    valid, train = planted.clean(config["number"], level, noise=0.002)
    return Outcome({"valid/error_rate": valid, "train/loss": train, "train/grad_norm": grad_norms(1, train.steps)})


@pytest.fixture
def study(client: httpx.Client) -> dict[str, Any]:
    created = create(client, conditional_spec())
    assert run_pending(client, adam_lr_drives) == 32
    return created


def chart(client: httpx.Client, study_id: int, kind: str, **params: object) -> dict[str, Any]:
    reply = client.get(f"{API}/studies/{study_id}/charts/{kind}", params=params)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_importance_ranks_each_arms_learning_rate_as_its_own_dimension(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    ranked = chart(client, sid, "importance")
    names = [p["name"] for p in ranked["params"]]
    assert names[0] == ADAM, ranked["params"]
    assert SGD in names and "weight_decay" in names  # every varied hyperparameter, conditional ones included
    by_name = {p["name"]: p for p in ranked["params"]}
    assert by_name[ADAM]["param"] == "learning_rate" and by_name[ADAM]["when"] == {"optimizer": ["adam"]}
    assert by_name[ADAM]["n"] == 16 and by_name["weight_decay"]["n"] == 32  # within the trials where each applies
    assert by_name[ADAM]["importance"] > 5 * by_name[SGD]["importance"]

    within = chart(client, sid, "importance", arm="optimizer=adam")
    assert within["arm"] == "optimizer=adam" and [p["name"] for p in within["params"]][0] == ADAM
    assert SGD not in [p["name"] for p in within["params"]] and within["n"] == 16

    refused = client.get(f"{API}/studies/{sid}/charts/importance", params={"arm": "optimizer=rmsprop"})
    assert refused.status_code == 422 and "optimizer=rmsprop" in refused.text


def test_contour_never_pools_two_arms_learning_rates(client: httpx.Client, study: dict) -> None:
    sid = study["id"]
    default = chart(client, sid, "contour")
    assert set(default["choices"]) == {ADAM, SGD, "weight_decay"}
    assert ADAM not in default["pairs"][SGD] and default["pairs"][ADAM] == ["weight_decay"]
    assert {default["x"], default["y"]} <= set(default["choices"]) and default["y"] in default["pairs"][default["x"]]

    adam = chart(client, sid, "contour", x=ADAM, y="weight_decay")
    trials = {t["id"]: t for t in client.get(f"{API}/studies/{sid}/trials", params={"limit": 100}).json()["items"]}
    assert len(adam["points"]["ids"]) == 16
    assert all(trials[i]["params"]["optimizer"] == "adam" for i in adam["points"]["ids"])
    assert min(adam["points"]["x"]) >= ADAM_LR[0] and max(adam["points"]["x"]) <= ADAM_LR[1]

    pooled = client.get(f"{API}/studies/{sid}/charts/contour", params={"x": ADAM, "y": SGD})
    assert pooled.status_code == 422 and "never defined in the same trials" in pooled.text
    ambiguous = client.get(f"{API}/studies/{sid}/charts/contour", params={"x": "learning_rate", "y": "weight_decay"})
    assert ambiguous.status_code == 422 and "declared per arm" in ambiguous.text
    # within one arm the plain name is unambiguous
    one_arm = chart(client, sid, "contour", arm="optimizer=sgd", x="learning_rate", y="weight_decay")
    assert one_arm["x"] == SGD and one_arm["choices"] == [SGD, "weight_decay"] and len(one_arm["points"]["ids"]) == 16


def test_replicas_are_drawn_marked_and_never_ranked_best(client: httpx.Client, study: dict) -> None:
    """A replica of the best Adam trial that lands far better than any original (a lucky seed) must
    not become the curves' rank 1 nor the history's best so far: the analysis' best stays."""
    sid = study["id"]
    best = {a["label"]: a["best_trial_id"] for a in analysis(client, sid)["arms"]}
    made = client.post(f"{API}/trials/{best['optimizer=adam']}/replicas", json={"count": 2})
    assert made.status_code == 201, made.text

    def lucky(config: dict[str, Any]) -> Outcome:
        valid, train = planted.clean(config["number"], 0.01, noise=0.001)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    assert run_pending(client, lucky) == 2
    replica_ids = set(made.json()["trial_ids"])
    curves = chart(client, sid, "curves", limit=5)
    ranked = [c for c in curves["curves"] if c["rank"] is not None]
    assert ranked[0]["id"] == best["optimizer=adam"] and [c["rank"] for c in ranked] == [1, 2, 3, 4, 5]
    copies = [c for c in curves["curves"] if c["replica_of"] is not None]
    assert {c["id"] for c in copies} == replica_ids and all(c["rank"] is None for c in copies)
    assert all(c["replica_of"] == best["optimizer=adam"] for c in copies)

    history = chart(client, sid, "history")
    assert set(history["replicas"]["ids"]) == replica_ids
    assert min(history["replicas"]["y"]) < min(history["best"]["y"])  # drawn, but not the best so far
    assert "replica of trial" in history["text"][str(next(iter(replica_ids)))]
    after = {a["label"]: a["best_trial_id"] for a in analysis(client, sid)["arms"]}
    assert after == best
