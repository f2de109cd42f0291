"""Every way a real run goes wrong is named (docs/analysis.md, "Which trials count"). Planted
studies fed through the worker protocol on SQLite and Postgres, one trial per case and its false
alarm beside it; each asserts the exact set of trials judged diverged, their reasons, and that the
analysis, the CSV, the study's best trial, every chart and every plot agree on them (one function
decides)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

from hpo.server.dashboard.plotdata import plot_data
from hpo.server.db import Database
from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, kinds, run_pending
from tests.server.analysis.test_planted import spec, unit_lr

Curves = Callable[[int], tuple[planted.Curve, planted.Curve]]

# Trial number -> (planted curves, the reason's kind or None for a false alarm that stays feasible).
CASES: dict[int, tuple[Curves, str | None]] = {
    1: (planted.nan_late, "training loss not finite"),
    3: (planted.collapse, "training loss ends no better than its initial value"),
    5: (lambda seed: planted.slow_climb(seed, to=2.0), "training loss ends no better than its initial value"),
    7: (lambda seed: planted.slow_climb(seed, to=6.0), "training loss diverged"),
    9: (planted.diverged_dip, "training loss diverged"),
    11: (planted.explode_settle, "training loss diverged"),
    12: (planted.spike_recovers, None),
    13: (planted.slow_learner, None),
    14: (planted.training_loss_rising, None),
}


def _plant(config: dict[str, Any]) -> Outcome:
    number = config["number"]
    curves, _ = CASES.get(number, (None, None))
    if curves is None:
        valid, train = planted.clean(number, 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
    else:
        valid, train = curves(number)
    if number == 1:  # the NaN run has the best validation error of the study before its loss turns NaN
        valid = planted.Curve(valid.steps, valid.values - 0.06)
    return Outcome({"valid/error_rate": valid, "train/loss": train})


def _diverged(result: dict[str, Any]) -> dict[int, str]:
    return {d["trial_id"]: d["reason"].split(":")[0] for d in result["infeasible"]["diverged"]}


def _marked(chart: dict[str, Any]) -> set[int]:
    return set(chart["infeasible"]["ids"])


def test_every_way_a_run_diverges_is_infeasible_everywhere(client: httpx.Client, db: Database) -> None:
    study = create(client, spec("diverged-every-way", num_trials=16))
    assert run_pending(client, _plant) == 16
    result = analysis(client, study["id"])
    ids = {t["number"]: t["id"] for t in client.get(f"{API}/studies/{study['id']}/trials").json()["items"]}
    expected = {ids[n]: reason for n, (_, reason) in CASES.items() if reason is not None}
    assert _diverged(result) == expected  # every case found, and no false alarm (spike, slow learner, rising)
    assert set(result["infeasible"]["trial_ids"]) == set(expected)
    assert math.isclose(result["infeasible_fraction"], 6 / 16)
    (arm,) = result["arms"]
    assert arm["n_infeasible"] == 6 and arm["best_trial_id"] not in expected  # the NaN run is not the best
    assert arm["best_value"] > 0.09  # the NaN run's 0.04 is not anyone's best
    assert "infeasible" in kinds(result) and "overfitting" not in kinds(result)
    shown = client.get(f"{API}/studies/{study['id']}").json()
    assert shown["best_trial_id"] == arm["best_trial_id"]
    rows = list(csv.DictReader(io.StringIO(client.get(f"{API}/studies.csv").text)))
    (row,) = [r for r in rows if r["id"] == str(study["id"])]
    assert int(row["best_trial_id"]) == arm["best_trial_id"] and float(row["best_validation"]) == arm["best_value"]
    # every chart and plot marks exactly the trials the analysis judged infeasible
    charts = f"{API}/studies/{study['id']}/charts"
    assert _marked(client.get(f"{charts}/history").json()) == set(expected)
    axis = client.get(f"{charts}/axis").json()
    assert set().union(*(_marked(panel) for panel in axis["panels"])) == set(expected)
    table = client.get(f"{API}/studies/{study['id']}/table", params={"sort": "objective", "limit": 100}).json()
    assert {r["id"] for r in table["rows"] if r["infeasible"]} == set(expected)
    assert {r["id"]: r["diverged"].split(":")[0] for r in table["rows"] if r["diverged"]} == expected
    assert table["rows"][0]["id"] == arm["best_trial_id"]  # sorted by objective, judged trials last
    plotted = plot_data(db, study["id"], "axis")["trials"]  # what the SVG/PNG axis plot draws as red crosses
    assert {t.id for t in plotted if t.infeasible} == set(expected)
    svg = client.get(f"{API}/studies/{study['id']}/plots/axis", params={"format": "svg"})
    assert svg.status_code == 200 and "infeasible" in svg.text


def test_accuracy_at_chance_is_infeasible_with_the_same_margin_as_error_rate(client: httpx.Client) -> None:
    """Objective `valid/accuracy` (max), 10 classes reported: runs at chance (0.1 with evaluation
    noise, best evaluations up to 0.12) are infeasible; a weak learner at 0.2 is not."""
    chance_runs: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        number = config["number"]
        if number % 4 == 1:
            chance_runs.add(config["trial_id"])
            accuracy = planted.accuracy_at_chance(number)
            train = planted.Curve(planted.TRAIN_STEPS, np.full(planted.TRAIN_STEPS.size, math.log(10)) * 0.995)
        else:
            valid, train = planted.clean(number, 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
            weak = 0.7 if number == 2 else 0.0  # accuracy 0.2: learned a little, a false alarm if flagged
            accuracy = planted.Curve(valid.steps, 1.0 - valid.values - weak)
        counts = planted.class_counts(planted.EVAL_STEPS)
        return Outcome({"valid/accuracy": accuracy, "train/loss": train, **counts})

    body = spec("accuracy-chance", num_trials=12)
    body["objective"] = {"metric": "valid/accuracy", "mode": "max"}
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert set(_diverged(result)) == chance_runs and len(chance_runs) == 3
    assert set(_diverged(result).values()) == {"no better than chance"}


def test_validation_loss_that_explodes_without_a_training_loss_is_diverged_not_overfitting(
    client: httpx.Client,
) -> None:
    exploding: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        if config["number"] % 3 == 0:
            exploding.add(config["trial_id"])
            return Outcome({"valid/loss": planted.valid_loss_explodes(config["number"])})
        level = 0.3 + 0.3 * (unit_lr(config) - 0.5) ** 2
        rng = np.random.default_rng(config["number"])
        loss = level + 2.0 * np.exp(-planted.EVAL_STEPS / 200) + 0.01 * rng.normal(size=planted.EVAL_STEPS.size)
        return Outcome({"valid/loss": planted.Curve(planted.EVAL_STEPS, loss)})

    body = spec("valid-loss-explodes", num_trials=12)
    body["objective"] = {"metric": "valid/loss", "mode": "min"}
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert set(_diverged(result)) == exploding and set(_diverged(result).values()) == {"validation loss diverged"}
    assert "overfitting" not in kinds(result) and result["overfitting"]["flagged"] == 0


def test_a_validation_loss_objective_at_chance_is_judged_with_known_classes(client: httpx.Client) -> None:
    """Objective `valid/loss`, 10 classes reported: runs whose training loss falls but whose
    validation loss stays at ln 10 (nothing generalizes) are no better than chance; the statistics
    that pick the candidates must not skip them because the objective is a loss."""
    at_chance: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        number = config["number"]
        _, train = planted.clean(number)
        rng = np.random.default_rng(number)
        if number % 4 == 1:
            at_chance.add(config["trial_id"])
            loss = math.log(10) + 0.01 * rng.normal(size=planted.EVAL_STEPS.size)
        else:
            level = 0.3 + 0.3 * (unit_lr(config) - 0.5) ** 2
            loss = level + 2.0 * np.exp(-planted.EVAL_STEPS / 200) + 0.01 * rng.normal(size=planted.EVAL_STEPS.size)
        curves = {"valid/loss": planted.Curve(planted.EVAL_STEPS, loss), "train/loss": train}
        return Outcome({**curves, **planted.class_counts(planted.EVAL_STEPS)})

    body = spec("valid-loss-chance", num_trials=12)
    body["objective"] = {"metric": "valid/loss", "mode": "min"}
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert set(_diverged(result)) == at_chance and set(_diverged(result).values()) == {"no better than chance"}
