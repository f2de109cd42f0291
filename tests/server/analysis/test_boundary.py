"""Boundary checks on Halton-sampled planted responses, in each scale's space."""

from __future__ import annotations

import math

import pytest
from scipy.stats import qmc

from hpo.server.analysis.model import TrialSummary
from hpo.server.analysis.rules.boundary import boundary_warnings, check_boundaries
from hpo.server.space.ranges import widened
from hpo.server.space.search_space import Dimension, dimensions, from_unit, unit

LR = Dimension("learning_rate", "nuisance", "float", 1e-4, 1.0, "log")
WD = Dimension("weight_decay", "nuisance", "float", 1e-6, 1e-2, "log")
MOMENTUM = Dimension("momentum", "nuisance", "float", 0.8, 0.999, "reverse_log")


def study(optimum_unit: float, n: int = 24, seed: int = 0, sign: float = 1.0) -> list[TrialSummary]:
    """Trials whose objective has a valley in the learning rate's unit position; weight decay and
    momentum do not matter."""
    points = qmc.Halton(3, scramble=True, seed=seed).random(n)
    trials = []
    for i, (u_lr, u_wd, u_m) in enumerate(points):
        y = 0.1 + 0.5 * (u_lr - optimum_unit) ** 2 + 0.002 * math.sin(37.0 * i)
        params = {
            "learning_rate": from_unit(LR, u_lr),
            "weight_decay": from_unit(WD, u_wd),
            "momentum": from_unit(MOMENTUM, u_m),
        }
        trials.append(TrialSummary(id=i + 1, number=i, arm={}, params=params, status="completed", objective=sign * y))
    return trials


def sides(trials: list[TrialSummary], sign: float = 1.0) -> dict[str, str | None]:
    return {c.dim.name: c.side for c in check_boundaries([LR, WD, MOMENTUM], trials, sign)}


@pytest.mark.parametrize("seed", range(10))
def test_optimum_beyond_max_is_flagged_on_the_max_side_only(seed: int) -> None:
    assert sides(study(1.3, seed=seed)) == {"learning_rate": "max", "weight_decay": None, "momentum": None}


@pytest.mark.parametrize("seed", range(10))
def test_optimum_inside_raises_nothing(seed: int) -> None:
    assert set(sides(study(0.5, seed=seed)).values()) == {None}


def test_min_side_and_max_mode() -> None:
    assert sides(study(-0.3))["learning_rate"] == "min"
    assert sides(study(1.3, sign=-1.0), sign=-1.0)["learning_rate"] == "max"  # maximizing minus the valley


def test_warning_names_param_side_and_a_wider_range() -> None:
    checks = check_boundaries([LR], study(1.3), 1.0)
    (w,) = boundary_warnings(checks, n_arms=1)
    assert w["kind"] == "boundary" and w["param"] == "learning_rate" and w["side"] == "max"
    assert "max = 100 " in w["message"] and "[0.0001, 1]" in w["message"]


def test_replicas_infeasible_and_too_few_trials_are_left_out() -> None:
    trials = study(1.3)[:5]
    assert check_boundaries([LR], trials, 1.0) == []
    nan_trials = [
        TrialSummary(id=100 + i, number=100 + i, arm={}, params={"learning_rate": 1.0}, status="infeasible")
        for i in range(5)
    ]
    assert check_boundaries([LR], trials + nan_trials, 1.0) == []


def test_conditional_declarations_are_checked_per_arm() -> None:
    spec = {
        "hyperparameters": [
            {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]},
            {
                "name": "learning_rate",
                "role": "nuisance",
                "type": "float",
                "min": 1e-4,
                "max": 1.0,
                "scale": "log",
                "when": {"optimizer": ["sgd"]},
            },
            {
                "name": "learning_rate",
                "role": "nuisance",
                "type": "float",
                "min": 1e-5,
                "max": 1e-1,
                "scale": "log",
                "when": {"optimizer": ["adam"]},
            },
            {"name": "batch_size", "role": "fixed", "value": 128},
        ]
    }
    dims = dimensions(spec)
    sgd = [TrialSummary(t.id, t.number, {"optimizer": "sgd"}, t.params, "completed", t.objective) for t in study(1.3)]
    checks = check_boundaries(dims, sgd, 1.0)
    assert [(c.dim.label, c.side) for c in checks] == [("learning_rate (optimizer=sgd)", "max")]


def test_unit_positions_and_widening_follow_the_scale() -> None:
    assert unit(LR, 1e-2) == pytest.approx(0.5)
    assert unit(MOMENTUM, 0.8) == pytest.approx(0.0) and unit(MOMENTUM, 0.999) == pytest.approx(1.0)
    assert from_unit(MOMENTUM, unit(MOMENTUM, 0.99) or 0) == pytest.approx(0.99)
    assert widened(LR, "max") == pytest.approx(100.0) and widened(LR, "min") == pytest.approx(1e-6)
    assert 0.999 < widened(MOMENTUM, "max") < 1.0
    assert widened(MOMENTUM, "min") == 0.0  # 1 - momentum can grow no further than 1
    dropout = Dimension("dropout", "nuisance", "float", 0.0, 0.5, "linear")
    assert widened(dropout, "min") is None and widened(dropout, "max") == 0.75
    layers = Dimension("layers", "nuisance", "int", 2, 8, "linear")
    assert widened(layers, "max") == 11 and widened(layers, "min") == 0
    width = Dimension("width", "nuisance", "discrete", values=(64, 128, 256))
    assert widened(width, "max") == 512 and widened(width, "min") == 32
