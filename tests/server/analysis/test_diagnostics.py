"""Training-curve checks on planted curves: each planted problem is found, and clean curves, pure
noise and other problems raise nothing else (a false alarm fails the test)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from hpo.server.analysis.model import Curve
from hpo.server.analysis.rules.diagnostics import check_curves, noise, smooth
from tests.server.analysis import planted

SEEDS = range(40)


def kinds(valid: Curve, train: Curve | None, sign: float = 1.0) -> set[str]:
    return {f.kind for f in check_curves(valid, train, sign=sign, horizon=planted.HORIZON)}


def test_clean_curves_raise_nothing() -> None:
    alarms = Counter(k for s in SEEDS for k in kinds(*planted.clean(s)))
    assert alarms == Counter()


@pytest.mark.parametrize(
    ("maker", "expected"),
    [
        (planted.overfitting, "overfitting"),
        (planted.still_improving, "still_improving"),
        (planted.noisy_late, "high_variance"),
        (planted.saturated_early, "saturated_early"),
        (planted.training_loss_rising, "training_loss_rising"),
    ],
)
def test_each_planted_problem_is_found_and_only_it(maker, expected: str) -> None:  # type: ignore[no-untyped-def]
    found = [kinds(*maker(s)) for s in SEEDS]
    assert all(expected in f for f in found)
    others = Counter(k for f in found for k in f if k != expected)
    assert sum(others.values()) <= 1, others  # at most one chance alarm in 40 noisy curves


def test_overfitting_facts_name_the_best_step_and_the_rise() -> None:
    valid, train = planted.overfitting(0)
    (finding,) = [f for f in check_curves(valid, train, horizon=planted.HORIZON) if f.kind == "overfitting"]
    assert 500 <= finding.facts["best_step"] <= 1100
    assert finding.facts["end"] - finding.facts["best"] > 0.1
    assert finding.facts["train_end"] < finding.facts["train_at_best"]


def test_overfitting_needs_the_training_loss_to_fall() -> None:
    valid, _ = planted.overfitting(0)
    flat_train = Curve(planted.TRAIN_STEPS, np.full(planted.TRAIN_STEPS.size, 0.5))
    rising_train = Curve(planted.TRAIN_STEPS, np.linspace(0.5, 1.5, planted.TRAIN_STEPS.size))
    assert "overfitting" not in kinds(valid, flat_train)
    assert "overfitting" not in kinds(valid, rising_train)
    # without a training curve a rising validation curve may be divergence: never called overfitting
    # (docs/analysis.md, "Which trials count")
    assert "overfitting" not in kinds(valid, None)


def test_max_mode_is_oriented() -> None:
    """An accuracy curve (higher is better) that falls after its best overfits; a rising one does not."""
    valid, train = planted.overfitting(3)
    accuracy = Curve(valid.steps, 1 - valid.values)
    assert "overfitting" in kinds(accuracy, train, sign=-1.0)
    clean_valid, clean_train = planted.clean(3)
    assert kinds(Curve(clean_valid.steps, 1 - clean_valid.values), clean_train, sign=-1.0) == set()


def test_pure_noise_and_short_or_non_finite_curves_are_quiet() -> None:
    rng = np.random.default_rng(0)
    noise_only = Curve(planted.EVAL_STEPS, 0.5 + 0.01 * rng.normal(size=planted.EVAL_STEPS.size))
    assert "overfitting" not in kinds(noise_only, None) and "still_improving" not in kinds(noise_only, None)
    assert kinds(Curve.of([100, 200, 300], [0.5, 0.4, 0.6]), None) == set()
    with_nan = Curve(planted.EVAL_STEPS, np.where(planted.EVAL_STEPS == 500, np.nan, planted.clean(1)[0].values))
    assert kinds(with_nan, planted.clean(1)[1]) == set()


def test_smooth_and_noise_helpers() -> None:
    values = np.array([1.0, 9.0, 1.0, 1.0, 1.0])
    assert list(smooth(values)) == [1.0, 1.0, 1.0, 1.0, 1.0]
    trend = np.linspace(0, 10, 50)
    assert noise(trend) == pytest.approx(0.0, abs=1e-12)  # a steady trend is not noise
    rng = np.random.default_rng(0)
    assert noise(rng.normal(scale=2.0, size=4000)) == pytest.approx(2.0, rel=0.1)
