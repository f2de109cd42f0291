"""The analysis validated on studies with planted answers, fed through the worker protocol over
HTTP (claim / metrics / checkpoints / complete / fail) on SQLite and Postgres. Each test asserts the
exact set of warnings: a missed problem fails, and so does a false alarm."""

from __future__ import annotations

import math
from typing import Any

import httpx
import numpy as np

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, grad_norms, kinds, run_pending

LR_MIN, LR_MAX = 1e-4, 1e-1
TRAINER = {"workload": "synthetic_mlp", "max_train_steps": 2000, "eval_every_steps": 100, "keep_best_checkpoints": 3}


def spec(name: str, num_trials: int = 24, scientific: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"planted: {name}",
        "goal": "validate the analysis",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "algorithm": "halton",
        "num_trials": num_trials,
        "seed": 0,
        "hyperparameters": [
            *(scientific or []),
            {
                "name": "learning_rate",
                "role": "nuisance",
                "type": "float",
                "min": LR_MIN,
                "max": LR_MAX,
                "scale": "log",
            },
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
            {"name": "batch_size", "role": "fixed", "value": 128},
        ],
        "trainer": TRAINER,
        "resources": {"workers": 1, "gpus_per_worker": 0, "cpus_per_worker": 1},
        "max_attempts": 3,
    }


def unit_lr(config: dict[str, Any]) -> float:
    lr = config["params"]["learning_rate"]
    return (math.log(lr) - math.log(LR_MIN)) / (math.log(LR_MAX) - math.log(LR_MIN))


def valley(optimum_unit: float, curves: Any = planted.clean, scale: float = 0.3) -> Any:
    """Clean curves whose level is a valley in the learning rate's position (weight decay does not matter)."""

    def plant(config: dict[str, Any]) -> Outcome:
        level = 0.1 + scale * (unit_lr(config) - optimum_unit) ** 2
        valid, train = curves(config["number"], level)
        return Outcome(
            {
                "valid/error_rate": valid,
                "train/loss": train,
                "train/grad_norm": grad_norms(config["number"], train.steps),
            }
        )

    return plant


def test_boundary_optimum_is_flagged_with_a_wider_range(client: httpx.Client) -> None:
    study = create(client, spec("boundary"))
    assert run_pending(client, valley(1.4)) == 24
    result = analysis(client, study["id"])
    assert kinds(result) == ["boundary"]
    (warning,) = result["warnings"]
    assert warning["param"] == "learning_rate" and warning["side"] == "max"
    assert "max = 3.16" in warning["message"]  # half the searched range again, in log space
    checks = {c["param"]: c for c in result["boundary"]}
    assert checks["learning_rate"]["side"] == "max" and checks["learning_rate"]["suggested"] == 3.16
    assert checks["weight_decay"]["side"] is None


def test_optimum_inside_and_clean_curves_raise_nothing(client: httpx.Client) -> None:
    study = create(client, spec("inside"))
    run_pending(client, valley(0.5))
    result = analysis(client, study["id"])
    assert result["warnings"] == []
    assert {c["param"]: c["side"] for c in result["boundary"]} == {"learning_rate": None, "weight_decay": None}
    (arm,) = result["arms"]
    assert arm["n_trials"] == 24 and arm["n_infeasible"] == 0 and arm["best_value"] < 0.11
    assert len(result["curves"]) == 3 and all(c["findings"] == [] for c in result["curves"])
    assert result["budget"][0]["flattened"] is True
    assert result["grad_clip"]["p90"] is not None and 1.0 < result["grad_clip"]["p90"] < 1.5
    assert result["max_train_steps"]["advice"] is None
    assert [c["param"] for c in result["caveats"]] == ["batch_size", "max_train_steps"]
    # false alarms of the newer rules: nothing diverged, overfits or is unstable; one arm compares nothing
    assert result["infeasible"]["diverged"] == [] and result["overfitting"] == {
        "examined": 24,
        "flagged": 0,
        "trial_ids": [],
        "exempt_ids": [],
    }
    assert result["comparison"] is None and result["trial_variance"]["measured"] is False


def test_planted_overfitting_is_found_in_the_best_trials(client: httpx.Client) -> None:
    study = create(client, spec("overfitting"))
    run_pending(client, valley(0.5, curves=planted.overfitting))
    result = analysis(client, study["id"])
    # the best three each warned, and one summary for the 21 others (every finished trial is examined)
    assert kinds(result) == ["overfitting"] * 4
    best_three = {c["trial_id"] for c in result["curves"]}
    assert {w["trial_id"] for w in result["warnings"]} == best_three | {None}
    assert "regularization" in result["warnings"][0]["message"]
    assert result["overfitting"]["examined"] == 24 and result["overfitting"]["flagged"] == 24
    (summary,) = [w for w in result["warnings"] if w["trial_id"] is None]
    assert "24 of the 24 finished trials overfit" in summary["message"]


def test_thirty_percent_nan_trials(client: httpx.Client) -> None:
    """Trials above 70% of the learning-rate range diverge (NaN loss, reported as infeasible); one
    more completes without a finite objective. The optimum sits well below them."""

    def plant(config: dict[str, Any]) -> Outcome:
        if unit_lr(config) > 0.7:
            return Outcome(fail=f"loss became NaN at step {300 + 10 * config['number']}", fail_step=300)
        outcome = valley(0.3)(config)
        if config["number"] == 1:
            nan = planted.Curve(planted.EVAL_STEPS, np.full(planted.EVAL_STEPS.size, np.nan))
            outcome.curves["valid/error_rate"] = nan
        return outcome

    study = create(client, spec("nan"))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["infeasible"]
    assert 0.25 <= result["infeasible_fraction"] <= 0.4
    (warning,) = result["warnings"]
    assert warning["param"] == "learning_rate" and warning["side"] == "max" and "loss became NaN" in warning["message"]
    reasons = {r["reason"]: r["count"] for r in result["infeasible"]["reasons"]}
    assert reasons["loss became NaN at step N"] >= 5 and reasons["no finite value of valid/error_rate"] == 1
    axis = client.get(f"{API}/studies/{study['id']}/plots/axis", params={"format": "svg"})
    assert axis.status_code == 200 and axis.text.count("infeasible") >= 1


def test_best_learning_rate_next_to_infeasible_ones_hints_instability(client: httpx.Client) -> None:
    def plant(config: dict[str, Any]) -> Outcome:
        if unit_lr(config) > 0.8:
            return Outcome(fail="loss diverged to Infinity", fail_step=200)
        return valley(0.8)(config)

    study = create(client, spec("unstable"))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert "instability" in kinds(result) and "boundary" not in kinds(result)
    (hint,) = [w for w in result["warnings"] if w["kind"] == "instability"]
    assert hint["param"] == "learning_rate" and hint["trial_id"] == result["arms"][0]["best_trial_id"]


def test_replicas_measure_trial_variance_and_flag_arms_within_noise(client: httpx.Client) -> None:
    """Two arms 0.002 apart; seeds add noise of 0.01 to every run. Replicas of each arm's best trial
    give `n_replicas` and `replica_std`, and the gap is reported as within noise."""
    arms = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]

    def plant(config: dict[str, Any]) -> Outcome:
        noise = 0.01 * np.random.default_rng(config["seed"]).normal()
        offset = 0.002 if config["params"]["optimizer"] == "sgd" else 0.0
        level = 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2 + offset + noise
        valid, train = planted.clean(config["number"], level, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("replicas", num_trials=8, scientific=arms))
    run_pending(client, plant)
    before = analysis(client, study["id"])
    assert all(a["n_replicas"] == 0 and a["replica_std"] is None for a in before["arms"])
    for arm in before["arms"]:
        reply = client.post(f"{API}/trials/{arm['best_trial_id']}/replicas", json={"count": 3})
        assert reply.status_code == 201 and len(reply.json()["trial_ids"]) == 3
    assert run_pending(client, plant) == 6
    after = analysis(client, study["id"])
    for arm in after["arms"]:
        assert arm["n_replicas"] == 3 and len(arm["replica_values"]) == 3  # the selected original left out
        assert 0.002 < arm["replica_std"] < 0.04
    assert {a["best_trial_id"] for a in after["arms"]} == {a["best_trial_id"] for a in before["arms"]}
    assert after["comparison"]["verdict"] == "within_noise" and after["trial_variance"]["measured"] is True
    assert kinds(after) == ["replicas_recommended", "within_noise"]
    assert all(a["n_trials"] == 8 for a in after["arms"])  # replicas are not counted as search trials


def test_an_arm_s_key_is_its_json_whatever_the_cache_holds() -> None:
    """arm_key keeps each arm's key (50,000 trials asked for theirs): 1, 1.0 and True are equal as
    cache keys but are three arms, and a list value is not kept but still keyed."""
    import json

    from hpo.server.analysis.model import arm_key

    arms = [{"b": 1, "a": "x"}, {"a": 1}, {"a": 1.0}, {"a": True}, {"a": None}, {"a": [1, 2]}, {}]
    for _ in range(2):
        for arm in arms:
            assert arm_key(arm) == json.dumps(arm, sort_keys=True, default=str)
    assert arm_key({"a": "x", "b": 1}) == arm_key({"b": 1, "a": "x"})
