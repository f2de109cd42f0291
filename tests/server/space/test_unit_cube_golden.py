"""Golden values of the unit-cube mapping, bit for bit: what the layout stores as `unit_point` and
maps to params, what the bayesian designer snaps to and what a warm start places earlier trials at.

Stored studies continue from these numbers (raising `num_trials`, a bayesian model fed the stored
unit points, a warm start from an earlier study), so a change in any of them, even in the last bit,
changes studies already running. The literals were generated once from the code and written here;
floats are compared by `float.hex`, so -0.0, NaN and every ulp count."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hpo.server.bayesian import settings, warm
from hpo.server.layout import quasi_random as layout
from hpo.server.space import dimension
from hpo.server.spec.model import Hyperparameter
from hpo.server.spec.parse import parse_spec
from tests.server.factories import study_spec

nan = math.nan

UNITS = [0.0, 1e-9, 0.1, 0.25, 0.5, 0.75, 0.9, 1 - 1e-9, 1.0]

DECLARATIONS: dict[str, dict[str, Any]] = {
    "float_linear": {"type": "float", "min": -2.0, "max": 3.0, "scale": "linear"},
    "float_log": {"type": "float", "min": 1e-5, "max": 0.1, "scale": "log"},
    "float_reverse_log": {"type": "float", "min": 0.8, "max": 0.999, "scale": "reverse_log"},
    "int_linear": {"type": "int", "min": 1.0, "max": 10.0, "scale": "linear"},
    "int_log": {"type": "int", "min": 16.0, "max": 512.0, "scale": "log"},
    "categorical": {"type": "categorical", "values": ["sgd", "adam", True, 2]},
    "discrete": {"type": "discrete", "values": [1, 2, 4, 8]},
}

MAP_UNIT: dict[str, list[Any]] = {
    "float_linear": [-2.0, -1.999999995, -1.5, -0.75, 0.5, 1.75, 2.5, 2.9999999950000005, 3.0],
    "float_log": [
        1e-05,
        1.0000000092103407e-05,
        2.5118864315095788e-05,
        9.999999999999991e-05,
        0.0010000000000000002,
        0.010000000000000004,
        0.03981071705534976,
        0.09999999907896598,
        0.1,
    ],
    "float_reverse_log": [
        0.8,
        0.8000000010596635,
        0.8822591962695051,
        0.9468170410305501,
        0.985857864376269,
        0.9962393969069137,
        0.9983013535353658,
        0.9989999999947017,
        0.999,
    ],
    "int_linear": [1, 1, 2, 3, 6, 8, 10, 10, 10],
    "int_log": [16, 16, 22, 37, 89, 214, 361, 512, 512],
    "categorical": ["sgd", "sgd", "sgd", "adam", True, 2, 2, 2, 2],
    "discrete": [1, 1, 1, 2, 4, 8, 8, 8, 8],
}

# Values to map back, per declaration (inside, on the bounds, outside, of the wrong kind).
VALUES: dict[str, list[Any]] = {
    "float_linear": [-2.0, -1.5, 0.0, 0.25, 1, 3.0, 3.5, "x", True],
    "float_log": [1e-5, 3e-5, 1e-3, 0.05, 0.1, 0.2, 0.0],
    "float_reverse_log": [0.8, 0.9, 0.95, 0.99, 0.999, 0.9999, 0.5],
    "int_linear": [1, 2, 5, 9, 10, 11, 5.0],
    "int_log": [16, 17, 64, 100, 511, 512, 8],
    "categorical": ["sgd", "adam", True, 2, 2.0, 1, "rmsprop"],
    "discrete": [1, 2, 4, 8, 4.0, 3, True],
}

TO_UNIT: dict[str, list[float]] = {
    "float_linear": [0.0, 0.1, 0.4, 0.45, 0.6, 1.0, nan, nan, nan],
    "float_log": [0.0, 0.11928031367991554, 0.5, 0.9247425010840047, 1.0, nan, nan],
    "float_reverse_log": [0.0, 0.13082402064781284, 0.26164804129562536, 0.5654120103239064, 1.0, nan, nan],
    "int_linear": [0.05, 0.15000000000000002, 0.45, 0.8500000000000001, 0.95, nan, 0.45],
    "int_log": [
        0.008935409394779447,
        0.02628030302931482,
        0.40532470356428363,
        0.5328965589888541,
        0.9991620315971583,
        0.9997208592870443,
        nan,
    ],
    "categorical": [0.125, 0.375, 0.625, 0.875, 0.875, nan, nan],
    "discrete": [0.125, 0.375, 0.625, 0.875, 0.625, nan, nan],
}


def _same(got: Any, expected: Any) -> bool:
    """Equal and of the same type; floats equal bit for bit (NaN to NaN, -0.0 apart from 0.0)."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        return float.hex(got) == float.hex(expected)
    return bool(got == expected)


def _declaration(kind: str) -> Hyperparameter:
    return Hyperparameter(name=kind, role="nuisance", **DECLARATIONS[kind])


@pytest.mark.parametrize("kind", sorted(DECLARATIONS))
def test_map_unit_is_unchanged(kind: str) -> None:
    hp = _declaration(kind)
    got = [dimension.map_unit(hp, u) for u in UNITS]
    assert all(_same(g, e) for g, e in zip(got, MAP_UNIT[kind], strict=True)), (got, MAP_UNIT[kind])


@pytest.mark.parametrize("kind", sorted(DECLARATIONS))
def test_to_unit_is_unchanged(kind: str) -> None:
    hp = _declaration(kind)
    got = [dimension.to_unit(hp, v) for v in VALUES[kind]]
    assert all(_same(g, e) for g, e in zip(got, TO_UNIT[kind], strict=True)), (got, TO_UNIT[kind])


HALTON = [
    (
        0,
        {"optimizer": "nesterov"},
        [0.10224233015287731, 0.9346983862017634, 0.8943413349392959, 0.7363974341982583],
        {
            "optimizer": "nesterov",
            "learning_rate": 1.7785235713855687,
            "momentum": 0.9982496545997749,
            "weight_decay": 0.0008822460788137531,
            "batch_size": 128,
        },
        2083679832,
    ),
    (
        0,
        {"optimizer": "adam"},
        [0.10224233015287731, 0.9346983862017634, 0.8943413349392959, 0.7363974341982583],
        {
            "optimizer": "adam",
            "learning_rate": 0.05480163866029341,
            "beta1": 0.8836497482934423,
            "weight_decay": 0.0008822460788137531,
            "batch_size": 128,
        },
        2083679832,
    ),
    (
        1,
        {"optimizer": "nesterov"},
        [0.6022423301528773, 0.2680317195350967, 0.09434133493929588, 0.16496886276968697],
        {
            "optimizer": "nesterov",
            "learning_rate": 0.00855024952204145,
            "momentum": 0.878675711209365,
            "weight_decay": 4.569571226066861e-06,
            "batch_size": 128,
        },
        369571992,
    ),
    (
        1,
        {"optimizer": "adam"},
        [0.6022423301528773, 0.2680317195350967, 0.09434133493929588, 0.16496886276968697],
        {
            "optimizer": "adam",
            "learning_rate": 0.00011806655140032845,
            "beta1": 0.9917727948025531,
            "weight_decay": 4.569571226066861e-06,
            "batch_size": 128,
        },
        369571992,
    ),
    (
        2,
        {"optimizer": "nesterov"},
        [0.3522423301528773, 0.6013650528684301, 0.294341334939296, 0.8792545770554012],
        {
            "optimizer": "nesterov",
            "learning_rate": 0.12331593699185407,
            "momentum": 0.9579523474376529,
            "weight_decay": 0.0032886549431586296,
            "batch_size": 128,
        },
        1009178997,
    ),
    (
        2,
        {"optimizer": "adam"},
        [0.3522423301528773, 0.6013650528684301, 0.294341334939296, 0.8792545770554012],
        {
            "optimizer": "adam",
            "learning_rate": 0.002543666740693004,
            "beta1": 0.9690607466870249,
            "weight_decay": 0.0032886549431586296,
            "batch_size": 128,
        },
        1009178997,
    ),
]


def test_seeded_halton_layout_is_unchanged() -> None:
    """The design example (seed 7): the stored `unit_point` of each draft and the params mapped from it."""
    drafts = layout.layout_trials(parse_spec(study_spec(num_trials=4, seed=7)), 0, 3)
    assert len(drafts) == len(HALTON)
    for draft, (index, arm, unit, params, seed) in zip(drafts, HALTON, strict=True):
        assert (draft.point_index, draft.arm, draft.seed) == (index, arm, seed)
        assert draft.unit_point is not None
        assert all(_same(g, e) for g, e in zip(draft.unit_point, unit, strict=True)), (draft.unit_point, unit)
        assert draft.params.keys() == params.keys()
        assert all(_same(draft.params[k], v) for k, v in params.items()), (draft.params, params)


# Trials of an earlier study, and where a warm start places each in the design example's arms
# (nesterov, adam): None where the trial is not a point of that arm.
STORED = [
    {"optimizer": "nesterov", "learning_rate": 0.01, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 128},
    {"optimizer": "adam", "learning_rate": 1e-3, "beta1": 0.95, "weight_decay": 1e-6, "batch_size": 128},
    {"optimizer": "adam", "learning_rate": 0.5, "beta1": 0.95, "weight_decay": 1e-6, "batch_size": 128},
    {"optimizer": "nesterov", "learning_rate": 0.01, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 64},
]
PLACED: list[list[list[float] | None]] = [
    [[0.5, 0.28759422716209637, 0.13082402064781284, 0.5], None],
    [None, [0.26164804129562536, 0.5, 0.5, 0.0]],
    [None, None],  # learning_rate outside adam's range
    [None, None],  # another fixed batch_size
]


def test_warm_start_placement_is_unchanged() -> None:
    spec = parse_spec(study_spec(algorithm="bayesian", num_trials=10))
    spaces = [settings.arm_space(spec, arm) for arm in layout.arms(spec)]
    for params, expected in zip(STORED, PLACED, strict=True):
        got = [warm._place(spec, space, params) for space in spaces]
        for point, want in zip(got, expected, strict=True):
            if want is None:
                assert point is None
            else:
                assert point is not None
                assert all(_same(g, e) for g, e in zip(point, want, strict=True)), (point, want)
