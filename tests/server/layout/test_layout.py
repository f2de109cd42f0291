"""Properties of the trial layout: ranges, balance, uniformity in the scale's space, low
discrepancy, reproducibility, continuation, pairing of arms, conditional parameters."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats
from scipy.stats import qmc

from hpo.server.layout.quasi_random import dimensions, layout_trials, trial_seed
from hpo.server.space.dimension import map_unit, to_unit
from hpo.server.spec.model import Hyperparameter
from hpo.server.spec.parse import parse_spec
from tests.server.factories import study_spec


def _space(*hyperparameters: dict, **overrides: object) -> object:
    return parse_spec(study_spec(hyperparameters=list(hyperparameters), **overrides))


def _float(name: str, low: float, high: float, scale: str = "linear") -> dict:
    return {"name": name, "role": "nuisance", "type": "float", "min": low, "max": high, "scale": scale}


def test_golden_first_points_of_the_design_example() -> None:
    """Pins the sequence: a scipy upgrade that changed it must be caught, not silently absorbed."""
    drafts = layout_trials(parse_spec(study_spec()), 0, 2)
    golden = [
        ("nesterov", {"learning_rate": 0.0015398013188287773, "momentum": 0.9593617619006336}),
        ("adam", {"learning_rate": 1.6430661458014166e-05, "beta1": 0.8817100612474879}),
        ("nesterov", {"learning_rate": 0.32029158140097236, "momentum": 0.9951188419264896}),
        ("adam", {"learning_rate": 0.007626437475239046, "beta1": 0.9916356382161957}),
    ]
    for draft, (optimizer, values) in zip(drafts, golden, strict=True):
        assert draft.arm == {"optimizer": optimizer}
        for name, value in values.items():
            assert draft.params[name] == pytest.approx(value, rel=1e-12)
    assert drafts[0].params["weight_decay"] == pytest.approx(0.0010542295570512832, rel=1e-12)
    assert [d.seed for d in drafts] == [821328062, 821328062, 1817441348, 1817441348]


def test_every_scale_stays_in_range() -> None:
    spec = _space(
        _float("a", -3.0, 5.0),
        _float("b", 1e-6, 10.0, "log"),
        _float("c", 0.5, 0.9999, "reverse_log"),
        {"name": "d", "role": "nuisance", "type": "int", "min": 1, "max": 1000, "scale": "log"},
    )
    for draft in layout_trials(spec, 0, 2000):
        p = draft.params
        assert -3.0 <= p["a"] <= 5.0 and 1e-6 <= p["b"] <= 10.0 and 0.5 <= p["c"] <= 0.9999
        assert isinstance(p["d"], int) and 1 <= p["d"] <= 1000


def test_int_and_categorical_values_are_balanced() -> None:
    spec = _space(
        {"name": "layers", "role": "nuisance", "type": "int", "min": 1, "max": 4},
        {"name": "act", "role": "nuisance", "type": "categorical", "values": ["relu", "gelu", "tanh"]},
    )
    drafts = layout_trials(spec, 0, 1200)
    layers = Counter(d.params["layers"] for d in drafts)
    acts = Counter(d.params["act"] for d in drafts)
    assert set(layers) == {1, 2, 3, 4} and max(layers.values()) - min(layers.values()) <= 12  # ends not halved
    assert set(acts) == {"relu", "gelu", "tanh"} and max(acts.values()) - min(acts.values()) <= 12


def test_log_scale_is_uniform_in_log_space() -> None:
    drafts = layout_trials(_space(_float("lr", 1e-5, 1.0, "log")), 0, 1000)
    logs = np.array([math.log10(d.params["lr"]) for d in drafts])
    assert stats.kstest((logs + 5) / 5, "uniform").pvalue > 0.5
    assert stats.kstest([d.params["lr"] for d in drafts], "uniform", args=(1e-5, 1.0)).pvalue < 1e-6


def test_reverse_log_makes_one_minus_value_log_uniform() -> None:
    drafts = layout_trials(_space(_float("momentum", 0.9, 0.999, "reverse_log")), 0, 1000)
    logs = np.array([math.log(1 - d.params["momentum"]) for d in drafts])
    low, high = math.log(1 - 0.999), math.log(1 - 0.9)
    assert stats.kstest((logs - low) / (high - low), "uniform").pvalue > 0.5


def test_halton_points_have_lower_discrepancy_than_random() -> None:
    spec = _space(_float("a", 0, 1), _float("b", 0, 1), _float("c", 0, 1), _float("d", 0, 1))
    halton = np.array([d.unit_point for d in layout_trials(spec, 0, 256)])
    random = np.random.default_rng(0).random((256, 4))
    assert qmc.discrepancy(halton) < qmc.discrepancy(random) / 2


def test_same_seed_same_trials_other_seed_other_trials() -> None:
    a = layout_trials(parse_spec(study_spec(seed=3)), 0, 20)
    b = layout_trials(parse_spec(study_spec(seed=3)), 0, 20)
    c = layout_trials(parse_spec(study_spec(seed=4)), 0, 20)
    assert a == b and [d.params for d in a] != [d.params for d in c]


@pytest.mark.parametrize("algorithm", ["halton", "random"])
def test_continuation_changes_nothing_already_laid_out(algorithm: str) -> None:
    spec = parse_spec(study_spec(algorithm=algorithm))
    assert layout_trials(spec, 0, 10) == layout_trials(spec, 0, 4) + layout_trials(spec, 4, 6)


def test_arms_share_points_and_seeds_and_conditionals_follow_when() -> None:
    drafts = layout_trials(parse_spec(study_spec()), 0, 50)
    for nesterov, adam in zip(drafts[0::2], drafts[1::2], strict=True):
        assert nesterov.unit_point == adam.unit_point and nesterov.seed == adam.seed
        assert set(nesterov.params) == {"optimizer", "learning_rate", "momentum", "weight_decay", "batch_size"}
        assert set(adam.params) == {"optimizer", "learning_rate", "beta1", "weight_decay", "batch_size"}
        assert nesterov.params["weight_decay"] == adam.params["weight_decay"]
        # One dimension per name: both learning rates sit at the same relative place in their ranges.
        rel_n = math.log(nesterov.params["learning_rate"] / 1e-3) / math.log(3.0 / 1e-3)
        rel_a = math.log(adam.params["learning_rate"] / 1e-5) / math.log(1e-1 / 1e-5)
        assert rel_n == pytest.approx(rel_a, abs=1e-9)


def test_dimensions_are_distinct_varied_names_sorted() -> None:
    assert dimensions(parse_spec(study_spec())) == ["beta1", "learning_rate", "momentum", "weight_decay"]


def test_continuous_scientific_joins_the_sequence() -> None:
    spec = _space(
        {"name": "dropout", "role": "scientific", "type": "float", "min": 0.0, "max": 0.5}, _float("lr", 0.1, 1)
    )
    drafts = layout_trials(spec, 0, 20)
    assert all(d.arm == {} for d in drafts) and len({d.params["dropout"] for d in drafts}) == 20


def test_grid_enumerates_one_and_two_dimensions() -> None:
    one = _space(_float("lr", 1e-3, 1e-1, "log"), algorithm="grid", num_trials=3)
    values = [d.params["lr"] for d in layout_trials(one, 0, 10)]
    assert values == pytest.approx([1e-3, 1e-2, 1e-1])
    two = _space(
        {"name": "act", "role": "nuisance", "type": "categorical", "values": ["relu", "gelu"]},
        _float("lr", 0.1, 0.3),
        algorithm="grid",
        num_trials=9,
    )
    drafts = layout_trials(two, 0, 100)
    assert len(drafts) == 6 and len({(d.params["act"], d.params["lr"]) for d in drafts}) == 6


def test_map_unit_ends_and_int_rounding() -> None:
    hp = Hyperparameter(name="n", role="nuisance", type="int", min=1, max=3)
    assert [map_unit(hp, u) for u in (0.0, 0.2, 0.5, 0.8, 0.9999)] == [1, 1, 2, 3, 3]
    cat = Hyperparameter(name="c", role="nuisance", type="categorical", values=["a", "b"])
    assert [map_unit(cat, u) for u in (0.0, 0.49, 0.5, 0.9999)] == ["a", "a", "b", "b"]


def test_trial_seeds_are_31_bit_and_distinct() -> None:
    seeds = {trial_seed(0, i) for i in range(1000)} | {trial_seed(0, 0, r) for r in range(1, 100)}
    assert len(seeds) == 1099 and all(0 <= s < 2**31 for s in seeds)


@pytest.mark.parametrize("scale", ["linear", "log", "reverse_log"])
def test_map_unit_stays_in_range_at_the_cube_edges(scale: str) -> None:
    """A designer's proposal may sit exactly on u = 1.0 (Halton never does): exp(log(0.1)) is an
    ulp above 0.1, which once stored a value outside the range and a NaN unit point."""
    hp = Hyperparameter(name="x", role="nuisance", type="float", min=1e-6, max=0.1, scale=scale)
    ends = [map_unit(hp, u) for u in (0.0, 1.0)]
    assert ends == pytest.approx([1e-6, 0.1]) and all(1e-6 <= v <= 0.1 for v in ends)
    assert [to_unit(hp, map_unit(hp, u)) for u in (0.0, 1.0)] == pytest.approx([0.0, 1.0])
