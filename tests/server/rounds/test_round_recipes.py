"""Recipes on a round (docs/rounds.md, "Recipes") over real HTTP, on SQLite and Postgres: each
creates the study the playbook prescribes from the baseline and the round's earlier studies, and
its readout lands in the round once that study has finished. Trials are planted."""

from __future__ import annotations

import math
from typing import Any

import httpx
import numpy as np

from hpo.server.analysis.model import Curve
from tests.server.analysis import planted
from tests.server.analysis.protocol import Outcome, run_pending
from tests.server.rounds.test_rounds_api import API, make_pipeline, make_round, valley

TRAIN_STEPS = np.arange(10, 2001, 10)


def exploration(round_id: int, name: str = "explore") -> dict[str, Any]:
    return {
        "name": name,
        "round_id": round_id,
        "num_trials": 16,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0, "scale": "log"},
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
        ],
    }


def recipe(client: httpx.Client, round_id: int, kind: str, body: dict[str, Any] | None = None, **query: Any) -> Any:
    return client.post(f"{API}/rounds/{round_id}/recipes/{kind}", json=body or {}, params=query)


def test_exploit_refines_the_space_previews_and_warm_starts(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    source = client.post(f"{API}/studies", json=exploration(rnd["id"])).json()
    run_pending(client, valley)  # the objective depends on learning_rate only
    before = client.get(f"{API}/studies").json()["total"]

    preview = recipe(client, rnd["id"], "exploit", {"options": {"num_trials": 12}}, dry_run="true")
    assert preview.status_code == 200, preview.text
    assert client.get(f"{API}/studies").json()["total"] == before  # a preview writes nothing
    spec = preview.json()["spec"]
    assert spec["algorithm"] == "bayesian" and spec["num_trials"] == 12 and spec["round_id"] == rnd["id"]
    assert spec["bayesian"]["warm_start"] == {"study_ids": [source["id"]]}
    by_name = {hp["name"]: hp for hp in spec["hyperparameters"]}
    lr = by_name["learning_rate"]
    assert lr["role"] == "nuisance" and 1e-3 <= lr["min"] < 0.01 < lr["max"] <= 1.0
    assert math.log(lr["max"] / lr["min"]) < 0.7 * math.log(1.0 / 1e-3)  # narrowed around the valley
    assert by_name["weight_decay"]["role"] == "fixed" and by_name["weight_decay"]["source"] == "insensitive"
    assert (by_name["batch_size"]["value"], by_name["batch_size"]["source"]) == (64, "baseline")
    assert any("insensitive" in note for note in preview.json()["notes"])

    spec["num_trials"] = 6  # edited before it runs
    created = recipe(client, rnd["id"], "exploit", {"spec": spec})
    assert created.status_code == 201, created.text
    study = created.json()["study"]
    assert study["algorithm"] == "bayesian" and study["num_trials"] == 6
    assert study["spec"]["bayesian"]["warm_start"]["study_ids"] == [source["id"]]
    view = client.get(f"{API}/rounds/{rnd['id']}").json()
    assert [(r["kind"], r["study_id"], r["readout"]) for r in view["recipes"]] == [("exploit", study["id"], None)]
    assert study["id"] in view["study_ids"]


def test_exploit_reaches_past_a_boundary_and_then_cannot_warm_start(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    client.post(f"{API}/studies", json=exploration(rnd["id"]))

    def edge(config: dict[str, Any]) -> Outcome:  # best at the largest learning rate searched
        level = 0.1 + 0.05 * (math.log10(config["params"]["learning_rate"]) - 0.0) ** 2
        valid, train = planted.clean(config["seed"], level=level, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    run_pending(client, edge)
    preview = recipe(client, rnd["id"], "exploit", dry_run="true").json()
    lr = {hp["name"]: hp for hp in preview["spec"]["hyperparameters"]}["learning_rate"]
    assert lr["max"] > 1.0
    assert "warm_start" not in (preview["spec"].get("bayesian") or {})
    assert any("boundary" in note for note in preview["notes"])


def test_recipes_refuse_what_the_round_lacks(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"])
    other = make_round(client, pipeline["id"], "another goal")
    empty = recipe(client, rnd["id"], "exploit")
    assert empty.status_code == 409 and "no finished study" in empty.json()["detail"]
    warmup = recipe(client, rnd["id"], "warmup")
    assert warmup.status_code == 409 and "instability recipe" in warmup.json()["detail"]
    elsewhere = client.post(f"{API}/studies", json=exploration(other["id"], "elsewhere")).json()
    foreign = recipe(client, rnd["id"], "longer", {"study_id": elsewhere["id"]})
    assert foreign.status_code == 422 and foreign.json()["detail"][0]["field"] == "study_id"
    assert recipe(client, rnd["id"], "nonsense").status_code == 422
    assert recipe(client, 999, "steps").status_code == 404
    unfinished = recipe(client, other["id"], "exploit", {"study_id": elsewhere["id"]})
    assert unfinished.status_code == 409 and "unfinished" in unfinished.json()["detail"]
    bad = recipe(client, rnd["id"], "steps", {"options": {"rates": 0}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "options.rates"
    assert client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"] == []


def fits(fastest_lr: float) -> Any:
    """Training loss reaching 0.05 soonest at `fastest_lr`, later the further a rate is from it."""

    def plant(config: dict[str, Any]) -> Outcome:
        lr = config["params"]["learning_rate"]
        rate = 0.01 / (1 + abs(math.log10(lr / fastest_lr)))
        train = Curve(TRAIN_STEPS, 2.0 * np.exp(-rate * TRAIN_STEPS))
        valid, _ = planted.clean(config["seed"], level=0.1)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    return plant


def test_steps_reads_the_fastest_step_and_refuses_an_edge(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"], "how long to train")
    made = recipe(client, rnd["id"], "steps")
    assert made.status_code == 201, made.text
    spec = made.json()["study"]["spec"]
    by_name = {hp["name"]: hp for hp in spec["hyperparameters"]}
    rates = by_name["learning_rate"]["values"]
    assert len(rates) == 5 and rates[2] == 0.1  # half-decades around the baseline's 0.1
    assert by_name["lr_schedule"]["value"] == "constant" and by_name["weight_decay"]["value"] == 0.0
    assert by_name["weight_decay"].get("source") is None  # the recipe's own, not the baseline's 1e-4
    run_pending(client, fits(0.1))
    [view] = client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"]
    readout = view["readout"]
    assert view["status"] == "completed" and readout["edge"] is False
    expected = int(TRAIN_STEPS[np.argmax(2.0 * np.exp(-0.01 * TRAIN_STEPS) <= 0.05)])
    assert readout["max_train_steps"] == expected and readout["fastest"]["learning_rate"] == 0.1

    again = recipe(client, rnd["id"], "steps")
    assert again.status_code == 201 and again.json()["study"]["name"].endswith("steps2")
    run_pending(client, fits(rates[-1]))  # fastest at the largest rate of the grid
    readouts = [r["readout"] for r in client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"]]
    assert readouts[1]["edge"] is True and readouts[1]["max_train_steps"] is None
    assert "edge of the grid" in readouts[1]["message"]


def test_instability_then_warmup_then_longer(client: httpx.Client) -> None:
    pipeline = make_pipeline(client)
    rnd = make_round(client, pipeline["id"], "is training unstable?")
    made = recipe(client, rnd["id"], "instability", {"options": {"learning_rate": 0.01}}).json()
    trainer = made["study"]["spec"]["trainer"]
    assert trainer["max_train_steps"] == 500 and trainer["eval_every_steps"] == 1
    assert made["options"]["rates"] == [0.02, 0.05, 0.1]

    def blows_up_from(limit: float) -> Any:
        def plant(config: dict[str, Any]) -> Outcome:
            if config["params"]["learning_rate"] >= limit:
                return Outcome(fail="diverged: loss is NaN", fail_step=120)
            return valley(config)

        return plant

    run_pending(client, blows_up_from(0.05))
    readout = client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"][0]["readout"]
    assert readout["unstable_learning_rate"] == 0.05
    assert [r["unstable"] for r in readout["rates"]] == [False, True, True]

    warm = recipe(client, rnd["id"], "warmup")
    assert warm.status_code == 201, warm.text
    by_name = {hp["name"]: hp for hp in warm.json()["study"]["spec"]["hyperparameters"]}
    assert (by_name["learning_rate"]["role"], by_name["learning_rate"]["value"]) == ("fixed", 0.5)
    assert by_name["warmup_steps"]["values"] == [10, 100, 200]  # up to 10% of 2,000 steps
    run_pending(
        client,
        lambda c: (
            blows_up_from(0.05)(c)
            if c["params"]["warmup_steps"] < 100
            else valley({**c, "params": {**c["params"], "learning_rate": 0.01}})
        ),
    )
    readouts = {r["kind"]: r["readout"] for r in client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"]}
    assert readouts["warmup"]["shortest_stable"] == 100

    sweep = client.post(f"{API}/studies", json=exploration(rnd["id"], "sweep")).json()
    run_pending(client, valley)
    longer = recipe(client, rnd["id"], "longer", {"study_id": sweep["id"], "options": {"top": 2}})
    assert longer.status_code == 201, longer.text
    study = longer.json()["study"]
    assert study["algorithm"] == "manual" and study["spec"]["trainer"]["max_train_steps"] == 4000
    best = client.get(f"{API}/studies/{sweep['id']}/trials", params={"order_by": "objective", "limit": 2}).json()
    long_trials = client.get(f"{API}/studies/{study['id']}/trials").json()["items"]
    assert [t["params"]["learning_rate"] for t in long_trials] == [t["params"]["learning_rate"] for t in best["items"]]
    run_pending(client, valley)
    readouts = {r["kind"]: r["readout"] for r in client.get(f"{API}/rounds/{rnd['id']}").json()["recipes"]}
    assert len(readouts["longer"]["runs"]) == 2 and readouts["longer"]["mean_change"] is not None
