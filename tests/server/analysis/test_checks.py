"""Study-level checks on plain data: arms and replicas, within-noise, max_train_steps advice,
gradient clipping, warmup, caveats, the regularizer exemption and the JSON-safety of the answer."""

from __future__ import annotations

import math

import numpy as np

from hpo.server.analysis.load import CurveStats, StudyInfo
from hpo.server.analysis.model import Curve, TrialSummary
from hpo.server.analysis.rules.arms import arm_summaries, comparison, comparison_warnings, trial_variance
from hpo.server.analysis.rules.training import (
    best_step_summary,
    caveats,
    clipping_warnings,
    grad_clip_summary,
    max_train_steps_warnings,
    warmup_warnings,
)
from hpo.server.analysis.service import StudyData, analysis_of, json_safe
from hpo.server.space.search_space import dimensions
from tests.server.analysis import planted


def trial(
    i: int, value: float | None, arm: str = "a", step: int = 1000, replica_of: int | None = None, **params: float
) -> TrialSummary:
    status = "completed" if value is not None else "infeasible"
    return TrialSummary(
        i, i, {"arm": arm}, {"arm": arm, **params}, status, value, step if value is not None else None, replica_of
    )


def test_best_per_arm_ignores_replicas_and_measures_their_spread_without_the_selected_original() -> None:
    trials = [
        trial(1, 0.30),
        trial(2, 0.20),
        trial(3, None),
        trial(4, 0.18, replica_of=2),
        trial(5, 0.22, replica_of=2),
        trial(6, 0.10, arm="b"),
    ]
    arms = arm_summaries(trials, 1.0)
    assert [a["label"] for a in arms] == ["arm=b", "arm=a"] and [a["rank"] for a in arms] == [1, 2]
    a = arms[1]
    assert a["best_trial_id"] == 2 and a["n_trials"] == 3 and a["n_infeasible"] == 1 and a["n_replicas"] == 2
    # winner's curse: the selected original (0.20) is not among the replica values
    assert a["replica_values"] == [0.18, 0.22] and math.isclose(a["replica_std"], 0.02 * math.sqrt(2))
    assert math.isclose(a["replica_mean"], 0.20)
    lo, hi = a["replica_ci"]
    assert lo < 0.18 and hi > 0.22  # t interval with 1 degree of freedom is wide
    assert arms[0]["replica_std"] is None and arms[0]["replica_ci"] is None
    assert [x["label"] for x in arm_summaries(trials, -1.0)] == ["arm=a", "arm=b"]  # maximizing


def test_arms_are_ranked_by_replica_means_where_they_exist() -> None:
    # arm a's lucky original (0.10) beats b's (0.12), but a's replicas average 0.20, b's 0.12
    trials = [trial(1, 0.10), trial(2, 0.12, arm="b")]
    trials += [trial(10 + i, 0.20 + 0.001 * i, replica_of=1) for i in range(3)]
    trials += [trial(20 + i, 0.12 + 0.001 * i, arm="b", replica_of=2) for i in range(3)]
    arms = arm_summaries(trials, 1.0)
    assert [a["label"] for a in arms] == ["arm=b", "arm=a"]


def _replicated(gap: float, n: int, seed: int = 0) -> list[TrialSummary]:
    rng = np.random.default_rng(seed)
    out = [trial(1, 0.2), trial(2, 0.2 + gap, arm="b")]
    out += [trial(100 + i, 0.2 + 0.01 * v, replica_of=1) for i, v in enumerate(rng.normal(size=n))]
    out += [trial(200 + i, 0.2 + gap + 0.01 * v, arm="b", replica_of=2) for i, v in enumerate(rng.normal(size=n))]
    return out


def test_comparison_uses_welch_on_replica_means() -> None:
    # 30 replicas per arm, a true gap of one trial-variance sigma: clearly different (p ~ 1e-4)
    arms = arm_summaries(_replicated(0.01, 30), 1.0)
    cmp = comparison(arms, 1.0)
    assert cmp is not None and cmp["verdict"] == "different" and cmp["method"] == "welch"
    assert cmp["best_arm"] == "arm=a" and cmp["ci"][0] > 0 and cmp["p_value"] < 0.01
    assert comparison_warnings(cmp, arms, 1) == []
    # the same gap with 3 replicas each: within noise, and replicas are recommended with a count
    arms = arm_summaries(_replicated(0.01, 3), 1.0)
    cmp = comparison(arms, 1.0)
    assert cmp is not None and cmp["verdict"] == "within_noise" and cmp["ci"][0] < 0 < cmp["ci"][1]
    kinds = [w["kind"] for w in comparison_warnings(cmp, arms, 7)]
    assert kinds == ["within_noise", "replicas_recommended"]
    assert "/api/v1/studies/7/replicas" in comparison_warnings(cmp, arms, 7)[1]["message"]


def test_without_replicas_the_verdict_is_unknown_and_variance_unmeasured() -> None:
    arms = arm_summaries([trial(1, 0.2), trial(2, 0.21, arm="b")], 1.0)
    cmp = comparison(arms, 1.0)
    assert cmp is not None and cmp["verdict"] == "unknown" and cmp["ci"] is None
    assert math.isclose(cmp["difference"], 0.01)
    assert [w["kind"] for w in comparison_warnings(cmp, arms, 1)] == ["replicas_recommended"]
    tv = trial_variance(arms, 0.003)
    assert tv["measured"] is False and tv["eval_noise_std"] == 0.003 and "unmeasured" in tv["message"]
    assert comparison(arm_summaries([trial(1, 0.2)], 1.0), 1.0) is None  # a single arm compares nothing
    assert trial_variance(arm_summaries(_replicated(0.01, 3), 1.0), None)["measured"] is True


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
    # converged curves (no late gain beyond noise) put best steps late by chance: no advice
    ids = np.arange(10)
    flat = _stats(ids, late_change=np.full(10, 0.0005), late_noise=np.full(10, 0.004))
    assert best_step_summary(late, 1.0, 2000, flat)["advice"] is None
    falling = _stats(ids, late_change=np.full(10, -0.05), late_noise=np.full(10, 0.004))
    assert best_step_summary(late, 1.0, 2000, falling)["advice"] == "train_longer"
    # arms are judged apart: arm b's early best steps do not make arm a's advice
    mixed = late + [trial(20 + i, 0.3, arm="b", step=1000) for i in range(10)]
    summary = best_step_summary(mixed, 1.0, 2000)
    assert [a["advice"] for a in summary["per_arm"]] == ["train_longer", None]
    (w,) = max_train_steps_warnings(summary)
    assert "of arm arm=a" in w["message"]


def _stats(ids: np.ndarray, **given: np.ndarray) -> CurveStats:
    n = len(ids)
    fields = ("first", "minimum", "end", "late_n", "late_min", "late_max", "late_noise", "late_change", "last_step")
    base = {f: np.zeros(n) for f in fields} | {"maximum": np.ones(n)}
    return CurveStats(trial_ids=ids, n=np.full(n, 20.0), **{**base, **given})


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


def _study(spec_extra: list[dict], curves: tuple[Curve, Curve], weight_decay: float = 0.0) -> StudyData:
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
            {"learning_rate": 10 ** (-4 + 4 * ((i * 0.618) % 1)), "weight_decay": weight_decay},
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
        stats={},
        above_best={},
    )


def test_overfitting_is_not_warned_about_at_low_settings_of_a_scientific_regularizer() -> None:
    curves = planted.overfitting(0)
    plain = analysis_of(_study([], curves))
    assert [w["kind"] for w in plain["warnings"]].count("overfitting") == 3
    wd = {"name": "weight_decay", "role": "scientific", "type": "float", "min": 0.0, "max": 0.1, "scale": "linear"}
    # the playbook's narrower wording: only low-strength settings are expected to overfit
    strong = analysis_of(_study([wd], curves, weight_decay=0.09))
    assert [w["kind"] for w in strong["warnings"]].count("overfitting") == 3
    exempt = analysis_of(_study([wd], curves))
    assert "overfitting" not in [w["kind"] for w in exempt["warnings"]]
    assert all(f["suppressed"] for c in exempt["curves"] for f in c["findings"] if f["kind"] == "overfitting")
    assert any(c["param"] == "weight_decay" and "regularizer" in c["message"] for c in exempt["caveats"])


def test_answer_is_json_safe() -> None:
    value = json_safe({"a": [np.float64(1.5), float("nan"), np.int64(3)], "b": (float("inf"),)})
    assert value == {"a": [1.5, None, 3], "b": [None]}


def test_overfitting_in_max_mode_says_the_metric_falls() -> None:
    from hpo.server.analysis.rules.curves import curve_warning
    from hpo.server.analysis.rules.diagnostics import check_curves

    valid, train = planted.overfitting(0)
    accuracy = Curve(valid.steps, 1.0 - valid.values)
    (finding,) = [f for f in check_curves(accuracy, train, sign=-1.0) if f.kind == "overfitting"]
    assert finding.facts["end"] < finding.facts["best"]
    entry = {"trial_id": 1, "rank": 1, "label": "all trials"}
    assert "then falls to" in curve_warning(entry, finding, "valid/accuracy")["message"]
