"""Study-level checks on plain data: arms and replicas, within-noise, max_train_steps advice,
gradient clipping, warmup, caveats, the regularizer exemption and the JSON-safety of the answer."""

from __future__ import annotations

import math

import numpy as np

from hpo.server.analysis.arms import arm_summaries, within_noise_warnings
from hpo.server.analysis.model import Curve, TrialSummary
from hpo.server.analysis.queries import StudyInfo
from hpo.server.analysis.service import StudyData, analysis_of, json_safe
from hpo.server.analysis.space import dimensions
from hpo.server.analysis.training import (
    best_step_summary,
    caveats,
    clipping_warnings,
    grad_clip_summary,
    max_train_steps_warnings,
    warmup_warnings,
)
from tests.analysis import planted


def trial(
    i: int, value: float | None, arm: str = "a", step: int = 1000, replica_of: int | None = None, **params: float
) -> TrialSummary:
    status = "completed" if value is not None else "infeasible"
    return TrialSummary(
        i, i, {"arm": arm}, {"arm": arm, **params}, status, value, step if value is not None else None, replica_of
    )


def test_best_per_arm_ignores_replicas_and_measures_their_spread() -> None:
    trials = [
        trial(1, 0.30),
        trial(2, 0.20),
        trial(3, None),
        trial(4, 0.18, replica_of=2),
        trial(5, 0.22, replica_of=2),
        trial(6, 0.10, arm="b"),
    ]
    arms = arm_summaries(trials, 1.0)
    assert [a["label"] for a in arms] == ["arm=b", "arm=a"]
    a = arms[1]
    assert a["best_trial_id"] == 2 and a["n_trials"] == 3 and a["n_infeasible"] == 1 and a["n_replicas"] == 2
    assert a["replica_values"] == [0.20, 0.18, 0.22] and math.isclose(a["replica_std"], 0.02)
    assert arms[0]["replica_std"] is None
    assert [x["label"] for x in arm_summaries(trials, -1.0)] == ["arm=a", "arm=b"]  # maximizing


def test_within_noise_needs_replicas_on_both_sides() -> None:
    close = [
        trial(1, 0.200),
        trial(2, 0.210, replica_of=1),
        trial(3, 0.205, arm="b"),
        trial(4, 0.195, arm="b", replica_of=3),
    ]
    (w,) = within_noise_warnings(arm_summaries(close, 1.0), 1.0)
    assert w["kind"] == "within_noise" and "arm=a" in w["message"] and "replicas" in w["message"]
    far = [
        trial(1, 0.200),
        trial(2, 0.201, replica_of=1),
        trial(3, 0.300, arm="b"),
        trial(4, 0.301, arm="b", replica_of=3),
    ]
    assert within_noise_warnings(arm_summaries(far, 1.0), 1.0) == []
    assert within_noise_warnings(arm_summaries(close[:3], 1.0), 1.0) == []


def test_max_train_steps_advice() -> None:
    early = [trial(i, 0.1 + 0.01 * i, step=100 + 10 * i) for i in range(10)]
    summary = best_step_summary(early, 1.0, 2000)
    assert summary["advice"] == "too_long"
    (w,) = max_train_steps_warnings(summary)
    assert w["kind"] == "max_train_steps" and "first 10%" in w["message"] and "500" in w["message"]
    late = [trial(i, 0.1 + 0.01 * i, step=2000 - 10 * i) for i in range(10)]
    assert best_step_summary(late, 1.0, 2000)["advice"] == "train_longer"
    spread = [trial(i, 0.1 + 0.01 * i, step=1000 + 100 * i) for i in range(10)]
    assert best_step_summary(spread, 1.0, 2000)["advice"] is None
    assert best_step_summary(early[:3], 1.0, 2000)["advice"] is None  # too few to judge


def test_gradient_clipping_threshold_and_aggressive_clipping() -> None:
    arms = arm_summaries([trial(1, 0.1), trial(2, 0.2, arm="b")], 1.0)
    stats = [
        {"trial_id": 1, "n": 100, "p90": 2.5, "clipped_fraction": 0.7},
        {"trial_id": 2, "n": 100, "p90": 1.0, "clipped_fraction": 0.1},
    ]
    summary = grad_clip_summary(stats, arms)
    assert summary["p90"] == 2.5 and summary["trial_id"] == 1 and len(summary["per_arm"]) == 2
    (w,) = clipping_warnings(summary)
    assert (
        w["kind"] == "aggressive_clipping"
        and w["trial_id"] == 1
        and "70%" in w["message"]
        and "learning rate" in w["message"]
    )


def test_long_warmup_and_caveats() -> None:
    spec = {
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "warmup_steps", "role": "fixed", "value": 200},
            {"name": "batch_size", "role": "fixed", "value": 128},
        ],
        "trainer": {"max_train_steps": 2000},
    }
    dims = dimensions(spec)
    arms = arm_summaries([trial(1, 0.1)], 1.0)
    (w,) = warmup_warnings(dims, spec["trainer"], arms, 2000)
    assert w["kind"] == "long_warmup" and "10%" in w["message"] and "2200" in w["message"]
    assert warmup_warnings(dims, spec["trainer"], arms, 10_000) == []
    assert [c["param"] for c in caveats(dims, spec["trainer"])] == ["warmup_steps", "batch_size", "max_train_steps"]


def _study(spec_extra: list[dict], curves: tuple[Curve, Curve]) -> StudyData:
    spec = {
        "hyperparameters": [
            *spec_extra,
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
        ],
        "trainer": {"max_train_steps": planted.HORIZON},
    }
    trials = [
        TrialSummary(
            i,
            i,
            {},
            {"learning_rate": 10 ** (-4 + 4 * ((i * 0.618) % 1)), "weight_decay": 0.0},
            "completed",
            0.1 + 0.01 * i,
            800,
        )
        for i in range(1, 9)
    ]
    valid, train = curves
    return StudyData(
        study=StudyInfo(1, "s", "", "active", spec, "valid/error_rate", "min"),
        trials=trials,
        ranks={1: 1, 2: 2, 3: 3},
        curves={i: {"valid/error_rate": valid, "train/loss": train} for i in (1, 2, 3)},
        grad=[],
        horizon=float(planted.HORIZON),
    )


def test_overfitting_is_not_warned_about_when_a_regularizer_is_scientific() -> None:
    curves = planted.overfitting(0)
    plain = analysis_of(_study([], curves))
    assert [w["kind"] for w in plain["warnings"]].count("overfitting") == 3
    wd = {"name": "weight_decay", "role": "scientific", "type": "float", "min": 0.0, "max": 0.1, "scale": "linear"}
    exempt = analysis_of(_study([wd], curves))
    assert "overfitting" not in [w["kind"] for w in exempt["warnings"]]
    assert all(f["suppressed"] for c in exempt["curves"] for f in c["findings"] if f["kind"] == "overfitting")
    assert any(c["param"] == "weight_decay" and "regularizer" in c["message"] for c in exempt["caveats"])


def test_answer_is_json_safe() -> None:
    value = json_safe({"a": [np.float64(1.5), float("nan"), np.int64(3)], "b": (float("inf"),)})
    assert value == {"a": [1.5, None, 3], "b": [None]}
