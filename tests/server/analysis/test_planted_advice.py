"""No advice misleads (docs/analysis.md, "Checks"). Planted studies fed through the worker protocol
on SQLite and Postgres: a lone glitched evaluation, infeasible trials concentrated in one
categorical value, an edge gap within the noise, a rising validation curve without a training loss,
each with the exact set of warnings (and the detection case beside its false alarm where the rule is
new)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import numpy as np

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, kinds, run_pending
from tests.server.analysis.test_planted import spec, unit_lr

ACTIVATION = {"name": "activation", "role": "nuisance", "type": "categorical", "values": ["relu", "gelu", "tanh"]}


def _level(config: dict[str, Any]) -> float:
    return 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2


def test_a_glitched_evaluation_is_flagged_and_never_the_best(client: httpx.Client) -> None:
    """One trial (not the best) logs a single evaluation of 0.0: it is flagged `outlier_evaluation`,
    its best is its genuine best, it is not the study's best and is not called overfitting."""
    glitched: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        if config["number"] == 5:
            glitched.add(config["trial_id"])
            valid, train = planted.glitched(config["number"], _level(config) + 0.02)
        else:
            valid, train = planted.clean(config["number"], _level(config))
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("glitch", num_trials=12))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["outlier_evaluation"]
    (warning,) = result["warnings"]
    assert {warning["trial_id"]} == glitched and "step 700 (0)" in warning["message"]
    (arm,) = result["arms"]
    assert arm["best_trial_id"] not in glitched and arm["best_value"] > 0.09
    shown = client.get(f"{API}/studies/{study['id']}").json()
    assert shown["best_trial_id"] == arm["best_trial_id"]
    assert result["overfitting"]["flagged"] == 0


def test_every_trial_of_one_categorical_value_infeasible_names_the_value(client: httpx.Client) -> None:
    def plant(config: dict[str, Any]) -> Outcome:
        if config["params"]["activation"] == "tanh":
            return Outcome(fail=f"loss became NaN at step {100 + config['number']}", fail_step=100)
        valid, train = planted.clean(config["number"], _level(config))
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    body = spec("one-value-fails", num_trials=18)
    body["hyperparameters"].insert(0, ACTIVATION)
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["infeasible"]
    (warning,) = result["warnings"]
    assert warning["param"] == "activation" and "activation = tanh" in warning["message"]
    assert "look for a bug" not in warning["message"]
    value = result["infeasible"]["value"]
    assert value["value"] == "tanh" and value["bad"] == value["n"] and value["bad_elsewhere"] == 0


def test_infeasible_trials_spread_over_values_name_none(client: httpx.Client) -> None:
    """False alarm: a third of the trials fail whatever their activation."""

    def plant(config: dict[str, Any]) -> Outcome:
        if config["number"] % 3 == 0:
            return Outcome(fail="out of memory", fail_step=10)
        valid, train = planted.clean(config["number"], _level(config))
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    body = spec("spread-failures", num_trials=18)
    body["hyperparameters"].insert(0, ACTIVATION)
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["infeasible"] and result["infeasible"]["value"] is None
    assert result["warnings"][0]["param"] != "activation" and "activation =" not in result["warnings"][0]["message"]


def test_an_edge_gap_within_the_noise_is_no_boundary(client: httpx.Client) -> None:
    """Weight decay does not matter but the trials in its top 10% are 0.004 better, about the
    evaluation noise: the edge cluster is reported `within_noise`, with no warning. The same edge
    0.05 better is flagged."""

    def planter(gain: float) -> Any:
        def plant(config: dict[str, Any]) -> Outcome:
            wd = config["params"]["weight_decay"]
            edge = math.log(wd / 1e-6) / math.log(1e4) > 0.9
            valid, train = planted.clean(config["number"], 0.1 - (gain if edge else 0.0), noise=0.004)
            return Outcome({"valid/error_rate": valid, "train/loss": train})

        return plant

    quiet = create(client, spec("edge-within-noise", num_trials=24))
    run_pending(client, planter(0.004))
    result = analysis(client, quiet["id"])
    checks = {c["param"]: c for c in result["boundary"]}
    assert checks["weight_decay"]["within_noise"] is True and checks["weight_decay"]["side"] is None
    assert "boundary" not in kinds(result)
    loud = create(client, spec("edge-beyond-noise", num_trials=24))
    run_pending(client, planter(0.05))
    result = analysis(client, loud["id"])
    checks = {c["param"]: c for c in result["boundary"]}
    assert checks["weight_decay"]["side"] == "max" and checks["weight_decay"]["gap"] > 0.04
    assert [w["param"] for w in result["warnings"] if w["kind"] == "boundary"] == ["weight_decay"]


def test_rising_validation_without_a_training_loss_is_not_overfitting(client: httpx.Client) -> None:
    """The planted overfitting curves with no `train/loss` logged: nothing says the training loss
    fell, so no overfitting is claimed (with it, test_planted flags every trial)."""

    def plant(config: dict[str, Any]) -> Outcome:
        valid, _ = planted.overfitting(config["number"], _level(config))
        return Outcome({"valid/error_rate": valid})

    study = create(client, spec("no-train-loss", num_trials=12))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert "overfitting" not in kinds(result) and result["overfitting"]["flagged"] == 0
    assert np.isfinite(result["arms"][0]["best_value"])


ARMS = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]


def test_replicas_that_diverge_make_the_verdict_unstable(client: httpx.Client) -> None:
    """Arm adam is 0.05 better, but 2 of its 6 replicas diverge (finite blow-up): on its 4
    survivors it would be `different`; it is `unstable`, with `2 of 6 diverged` reported. Arm sgd's
    replicas all survive (`0 of 6 diverged`)."""
    originals: set[int] = set()
    diverging: list[int] = []

    def plant(config: dict[str, Any]) -> Outcome:
        number, adam = config["number"], config["params"]["optimizer"] == "adam"
        if originals and config["trial_id"] not in originals and adam and len(diverging) < 2:
            diverging.append(config["trial_id"])
            valid, train = planted.diverged(number)
            return Outcome({"valid/error_rate": valid, "train/loss": train})
        noise = 0.002 * np.random.default_rng(config["seed"]).normal()
        valid, train = planted.clean(number, 0.1 + (0.0 if adam else 0.05) + noise, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("unstable-replicas", num_trials=4, scientific=ARMS))
    run_pending(client, plant)
    originals.update(t["id"] for t in client.get(f"{API}/studies/{study['id']}/trials").json()["items"])
    assert client.post(f"{API}/studies/{study['id']}/replicas", json={"count": 6}).status_code == 201
    assert run_pending(client, plant) == 12
    result = analysis(client, study["id"])
    arms = {a["label"]: a for a in result["arms"]}
    assert arms["optimizer=adam"]["replicas_diverged"] == "2 of 6 diverged"
    assert arms["optimizer=adam"]["n_replicas"] == 4 and arms["optimizer=sgd"]["replicas_diverged"] == "0 of 6 diverged"
    cmp = result["comparison"]
    assert cmp["verdict"] == "unstable" and cmp["unstable_arms"] == ["optimizer=adam"] and cmp["ci"][0] > 0
    assert kinds(result) == ["replicas_diverged"]
    assert result["warnings"][0]["trial_id"] == arms["optimizer=adam"]["best_trial_id"]
    assert set(diverging) <= set(result["infeasible"]["trial_ids"])
    page = client.get(f"/studies/{study['id']}/analysis-sections").text
    assert "Unstable: replicas of optimizer=adam diverged" in page and "(2 of 6 diverged)" in page


def test_trials_that_stopped_short_are_flagged_and_left_out_of_conclusions(client: httpx.Client) -> None:
    """Half the trials complete at step 400 of 2,000 (a crash that exited 0): flagged, counted in
    the caveat, and left out of the boundary and budget conclusions. With `budget_unit: epochs`
    the same study keeps them and warns about nothing."""
    short: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        valid, train = planted.clean(config["number"], _level(config), noise=0.002)
        if config["number"] % 2:
            short.add(config["trial_id"])
            valid = planted.Curve(valid.steps[valid.steps <= 400], valid.values[valid.steps <= 400])
            train = planted.Curve(train.steps[train.steps <= 400], train.values[train.steps <= 400])
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("stopped-short", num_trials=24))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    found = result["stopped_short"]
    assert set(found["trial_ids"]) == short and found["count"] == 12 and found["reference_step"] == 2000
    assert kinds(result) == ["stopped_short"] and "12 of the 24 completed trials" in result["warnings"][0]["message"]
    (caveat,) = [c for c in result["caveats"] if c["param"] == "stopped_short"]
    assert caveat["value"] == 12
    assert all(c["n"] == 12 for c in result["boundary"]) and result["budget"][0]["n"] == 12
    assert result["arms"][0]["n_trials"] == 24  # still trials of the study, and still feasible
    short.clear()
    body = spec("stopped-per-epoch", num_trials=24)
    body["trainer"] = {**body["trainer"], "budget_unit": "epochs"}
    epochs = create(client, body)
    run_pending(client, plant)
    result = analysis(client, epochs["id"])
    assert result["stopped_short"]["count"] == 12 and result["stopped_short"]["per_epoch"] is True
    assert kinds(result) == [] and result["budget"][0]["n"] == 24
    assert all(c["n"] == 24 for c in result["boundary"])


def test_an_ordered_scientific_hyperparameter_is_drawn_along_its_values(client: httpx.Client) -> None:
    """Depth 2, 4, 8 with the middle best (a U): the isolation series, its chart and plot follow
    the values 2, 4, 8, not the arms' rank (4, then 2 or 8)."""
    depth = [{"name": "num_layers", "role": "scientific", "type": "discrete", "values": [2, 4, 8]}]

    def plant(config: dict[str, Any]) -> Outcome:
        offset = {2: 0.05, 4: 0.0, 8: 0.03}[config["params"]["num_layers"]]
        valid, train = planted.clean(config["number"], _level(config) + offset, noise=0.002)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("u-shape", num_trials=6, scientific=depth))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert [a["label"] for a in result["arms"]][0] == "num_layers=4"  # ranked: the middle first
    (series,) = [s for s in result["isolation"] if s["kind"] == "arms"]
    assert series["ordered"] is True
    assert [p["x"] for p in series["points"]] == ["num_layers=2", "num_layers=4", "num_layers=8"]
    values = [p["best_value"] for p in series["points"]]
    assert values[1] < values[0] and values[1] < values[2]  # the U is visible
    chart = client.get(f"{API}/studies/{study['id']}/charts/isolation").json()
    (drawn,) = [s for s in chart["series"] if s["kind"] == "arms"]
    assert drawn["x"] == ["num_layers=2", "num_layers=4", "num_layers=8"] and drawn["ordered"] is True
