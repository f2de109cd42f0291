"""The evidence each rule needs (docs/analysis.md, "The evidence each rule needs"): each curve rule
states the evidence it needs and abstains below it, listed under the analysis' `skipped`. Each rule
at its threshold, one evaluation (or trial) below and one above, on the real rules; then planted
studies through the worker protocol on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from hpo.server.analysis.model import Curve
from hpo.server.analysis.rules.budget import MIN_TRIALS
from hpo.server.analysis.rules.diagnostics import NEEDS, TRAIN_LOGS_NEEDED, check_curves, curve_needs
from hpo.server.analysis.rules.training import TOP_MIN
from tests.server.analysis import planted
from tests.server.analysis.protocol import Outcome, analysis, create, kinds, run_pending
from tests.server.analysis.test_planted import spec, unit_lr

HORIZON = planted.HORIZON


def steps(n: int) -> np.ndarray:
    return np.linspace(HORIZON / n, HORIZON, n)


def train_loss(seed: int = 0) -> Curve:
    rng = np.random.default_rng(seed)
    s = planted.TRAIN_STEPS
    return Curve(s, 0.01 + 2.0 * np.exp(-s / 300) * (1 + 0.03 * rng.normal(size=s.size)))


def noisy_late(n: int, seed: int = 0) -> Curve:
    """Falls from chance by a tenth of training, then jumps by 0.06 between evaluations in its second half."""
    s = steps(n)
    rng = np.random.default_rng(seed)
    jitter = np.where(s > HORIZON / 2, 0.06 * rng.normal(size=n), 0.0)
    return Curve(s, 0.1 + 0.8 * np.exp(-s / 200) + jitter)


def improving(n: int, seed: int = 0) -> Curve:
    s = steps(n)
    return Curve(s, 0.1 + 0.8 * np.exp(-s / 800) + 0.002 * np.random.default_rng(seed).normal(size=n))


def overfits(n: int, seed: int = 0) -> Curve:
    """Best near step 600 at 0.05, doubling to 0.10 by the end while the training loss falls."""
    s = steps(n)
    drop = 0.05 + 0.85 * np.exp(-s / 120)
    rise = 0.05 * np.clip((s - 600) / 1400, 0, None)
    return Curve(s, drop + rise + 0.001 * np.random.default_rng(seed).normal(size=n))


CASES = [("high_variance", noisy_late), ("still_improving", improving), ("overfitting", overfits)]


@pytest.mark.parametrize(("check", "make"), CASES)
def test_each_curve_rule_abstains_below_its_minimum_and_judges_from_it(check: str, make: Any) -> None:
    need = NEEDS[check][1]
    for n in (need, need + 1):
        found = {f.kind for f in check_curves(make(n), train_loss())}
        assert check in found, (n, found)
        assert check not in dict(curve_needs(make(n), train_loss(), "train/loss"))
    below = make(need - 1)
    assert check not in {f.kind for f in check_curves(below, train_loss())}
    assert (check, f"{need - 1} evaluations, needs {need}") in curve_needs(below, train_loss(), "train/loss")


def test_overfitting_needs_a_training_loss_with_enough_logs() -> None:
    curve = overfits(20)
    assert ("overfitting", "needs train/loss") in curve_needs(curve, None, "train/loss")
    short = Curve(planted.TRAIN_STEPS[: TRAIN_LOGS_NEEDED - 1], train_loss().values[: TRAIN_LOGS_NEEDED - 1])
    reason = f"{TRAIN_LOGS_NEEDED - 1} logs of train/loss, needs {TRAIN_LOGS_NEEDED}"
    assert ("overfitting", reason) in curve_needs(curve, short, "train/loss")
    assert curve_needs(curve, train_loss(), "train/loss") == []


def test_five_decreasing_evaluations_raise_no_high_variance() -> None:
    """The issue's case: 5 evaluations strictly decreasing from chance."""
    curve = Curve(steps(5), np.array([0.9, 0.4, 0.25, 0.2, 0.18]))
    assert check_curves(curve, train_loss()) == []
    assert ("high_variance", "5 evaluations, needs 16") in curve_needs(curve, train_loss(), "train/loss")


def short_plant(n_evals: int) -> Any:
    def plant(config: dict[str, Any]) -> Outcome:
        s = steps(n_evals)
        level = 0.1 + 0.01 * config["number"]
        valid = Curve(s, level + 0.8 * np.exp(-s / 200))
        return Outcome({"valid/error_rate": valid, "train/loss": train_loss(config["number"])})

    return plant


def test_short_curves_are_skipped_not_warned_about(client: httpx.Client) -> None:
    """5 evaluations per trial: no curve rule fires and each is listed under `skipped` with the
    evaluations it had and needs, merged over the trials; 3 trials: best-step and budget abstain."""
    study = create(client, spec("short", num_trials=3))
    run_pending(client, short_plant(5))
    result = analysis(client, study["id"])
    assert not {"high_variance", "still_improving", "overfitting", "too_few_trials", "max_train_steps"} & set(
        kinds(result)
    )
    skipped = {s["check"]: s for s in result["skipped"]}
    assert skipped["high_variance"]["reason"] == "5 evaluations, needs 16"
    assert skipped["still_improving"]["reason"] == "5 evaluations, needs 16"
    assert skipped["overfitting"]["reason"] == "5 evaluations, needs 8"
    assert len(skipped["high_variance"]["trial_ids"]) == 3
    assert skipped["max_train_steps"]["reason"] == f"3 finished trials, needs {TOP_MIN}"
    assert skipped["too_few_trials"]["reason"] == f"3 finished trials, needs {MIN_TRIALS}"


def test_enough_evidence_skips_nothing(client: httpx.Client) -> None:
    study = create(client, spec("long", num_trials=10))
    run_pending(client, short_plant(20))
    result = analysis(client, study["id"])
    # only the checks whose names this study lacks (no warmup setting, no gradient norms reported)
    assert {(s["check"], s["reason"]) for s in result["skipped"]} == {
        ("long_warmup", "needs warmup_steps or warmup_fraction"),
        ("aggressive_clipping", "needs train/grad_norm"),
    }


def test_loss_instability_abstains_without_a_training_loss(client: httpx.Client) -> None:
    """Only the validation error reported: the trials just above the best learning rate have no
    training loss to read, so the rule is listed as skipped, naming them; with it, it is not."""

    def plant(with_loss: bool) -> Any:
        def run(config: dict[str, Any]) -> Outcome:
            valid, train = planted.clean(config["number"], 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
            return Outcome({"valid/error_rate": valid, **({"train/loss": train} if with_loss else {})})

        return run

    bare = create(client, spec("no-loss", num_trials=12))
    run_pending(client, plant(False))
    skipped = {s["check"]: s for s in analysis(client, bare["id"])["skipped"]}
    assert skipped["instability"]["reason"] == "needs train/loss" and skipped["instability"]["trial_ids"]
    full = create(client, spec("with-loss", num_trials=12))
    run_pending(client, plant(True))
    assert "instability" not in {s["check"] for s in analysis(client, full["id"])["skipped"]}
