"""The analysis' rules (docs/analysis.md, "Checks") on planted studies fed through the worker
protocol, on SQLite and Postgres: for each rule a study where it must fire (detection) and one where
it must not (false alarm; the clean study of test_planted.py is the shared false-alarm case for
most). Each asserts the exact set of warnings."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import httpx
import numpy as np

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, kinds, run_pending
from tests.server.analysis.test_planted import spec, unit_lr, valley

ARMS = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]


def test_finite_divergence_and_chance_are_infeasible(client: httpx.Client) -> None:
    """Trials above 70% of the learning-rate range blow up to 2.5e7 and sit at chance with finite
    values; one more never learns. All count as infeasible: fraction, reasons, instability hint,
    red crosses, and the bootstrap gives them no wins."""
    planted_ids: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        u = unit_lr(config)
        if u > 0.7 or config["number"] == 2:
            planted_ids.add(config["trial_id"])
            valid, train = planted.diverged(config["number"]) if u > 0.7 else planted.at_chance(config["number"])
        else:
            valid, train = planted.clean(config["number"], 0.1 + 0.3 * (u - 0.65) ** 2)
        return Outcome({"valid/error_rate": valid, "train/loss": train, **planted.class_counts(planted.EVAL_STEPS)})

    study = create(client, spec("diverged", num_trials=16))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["infeasible", "instability"]
    judged = {d["trial_id"]: d["reason"] for d in result["infeasible"]["diverged"]}
    assert set(judged) == planted_ids and len(planted_ids) >= 5
    assert set(result["infeasible"]["trial_ids"]) == planted_ids
    reasons = {r["reason"] for r in result["infeasible"]["reasons"]}
    assert reasons == {"training loss diverged", "no better than chance"}
    assert math.isclose(result["infeasible_fraction"], len(planted_ids) / 16)
    (arm,) = result["arms"]
    assert arm["n_infeasible"] == len(planted_ids) and arm["best_value"] < 0.11
    (budget,) = result["budget"]
    assert budget["n"] == 16 and max(v for v in budget["p95"] if v is not None) < 0.9  # never won by a diverged trial
    axis = client.get(f"{API}/studies/{study['id']}/plots/axis", params={"format": "svg"})
    assert axis.status_code == 200 and "infeasible" in axis.text


def test_cliff_at_the_lower_edge_is_a_boundary(client: httpx.Client) -> None:
    """Flat everywhere except the lowest 10% of the learning-rate range: no trend, still an edge."""

    def plant(config: dict[str, Any]) -> Outcome:
        valid, train = planted.clean(config["number"], 0.1 if unit_lr(config) < 0.1 else 0.3)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("cliff"))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["boundary"]
    checks = {c["param"]: c for c in result["boundary"]}
    assert checks["learning_rate"]["side"] == "min" and checks["learning_rate"]["top_in_band"] == 2
    assert checks["weight_decay"]["side"] is None


def test_overfitting_that_doubles_the_error_is_found_in_every_trial(client: httpx.Client) -> None:
    study = create(client, spec("doubling", num_trials=12))

    def plant(config: dict[str, Any]) -> Outcome:
        valid, train = planted.overfit_doubling(config["number"], 0.05 + 0.02 * (unit_lr(config) - 0.5) ** 2)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["overfitting"] * 4
    assert result["overfitting"]["flagged"] == 12 and result["overfitting"]["examined"] == 12
    first = next(w for w in result["warnings"] if w["trial_id"] is not None)
    assert "then rises to 0.09" in first["message"]


def test_regularizer_exemption_covers_only_low_strength_settings_and_isolation_uses_its_scale(
    client: httpx.Client,
) -> None:
    """Weight decay is the scientific hyperparameter (log scale); every trial overfits. Only trials
    in the lower half of its range are exempt; the isolation series is on its log scale with a
    bootstrap interval per bucket."""
    wd = {"name": "weight_decay", "role": "scientific", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"}
    body = spec("regularizer", num_trials=12)
    body["hyperparameters"] = [wd, *(h for h in body["hyperparameters"] if h["name"] != "weight_decay")]
    study = create(client, body)
    run_pending(client, valley(0.5, curves=planted.overfitting))
    result = analysis(client, study["id"])
    trials = {t["id"]: t for t in client.get(f"{API}/studies/{study['id']}/trials").json()["items"]}

    def low(trial_id: int) -> bool:
        return math.log(trials[trial_id]["params"]["weight_decay"] / 1e-6) / math.log(1e4) <= 0.5

    screen = result["overfitting"]
    assert screen["flagged"] == 12 and screen["exempt_ids"] and screen["trial_ids"]
    assert all(low(i) for i in screen["exempt_ids"]) and not any(low(i) for i in screen["trial_ids"])
    warned = [w["trial_id"] for w in result["warnings"] if w["kind"] == "overfitting" and w["trial_id"]]
    assert all(not low(i) for i in warned)
    for report in result["curves"]:
        for finding in report["findings"]:
            if finding["kind"] == "overfitting":
                assert finding["suppressed"] == low(report["trial_id"])
    (series,) = [s for s in result["isolation"] if s["param"] == "weight_decay"]
    assert series["scale"] == "log" and len(series["points"]) == 4
    xs = [p["x"] for p in series["points"]]
    ratios = [b / a for a, b in zip(xs, xs[1:], strict=False)]
    assert all(math.isclose(r, 10.0) for r in ratios)  # buckets equally wide in log space: 1e4 / 4 buckets
    assert all(p["lo"] <= p["best_value"] <= p["hi"] for p in series["points"])
    plot = client.get(f"{API}/studies/{study['id']}/plots/isolation", params={"format": "svg"})
    assert plot.status_code == 200 and plot.text.startswith("<?xml")


def test_training_loss_rising_just_above_the_best_learning_rate_is_instability(client: httpx.Client) -> None:
    def plant(config: dict[str, Any]) -> Outcome:
        u = unit_lr(config)
        curves = planted.unstable_train if u > 0.45 else planted.clean
        valid, train = curves(config["number"], 0.1 + 0.3 * (u - 0.45) ** 2)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("loss-instability", num_trials=16))
    run_pending(client, plant)
    result = analysis(client, study["id"])
    assert kinds(result) == ["instability"]
    (w,) = result["warnings"]
    assert w["param"] == "learning_rate" and "rises after declining" in w["message"]


def test_max_train_steps_advice_fires_on_improving_curves_only(client: httpx.Client) -> None:
    improving = create(client, spec("improving", num_trials=12))
    run_pending(client, valley(0.5, curves=lambda seed, level: planted.still_improving(seed)))
    result = analysis(client, improving["id"])
    assert result["max_train_steps"]["advice"] == "train_longer"
    assert "max_train_steps" in kinds(result)
    converged = create(client, spec("lucky-last", num_trials=12))
    run_pending(client, valley(0.5, curves=planted.lucky_last))
    result = analysis(client, converged["id"])
    (arm,) = result["max_train_steps"]["per_arm"]
    assert sum(f >= 0.75 for f in arm["fractions"]) >= 0.9 * len(arm["fractions"])  # the old rule would fire...
    assert arm["advice"] is None and kinds(result) == []  # ...but the curves have converged


def test_clipped_fraction_comes_from_per_step_norms(client: httpx.Client) -> None:
    """Clipping threshold 1.0. Arm adam clips its first 38.7% of steps (the cumulative series then
    averages about 62%); arm sgd clips 70% of its steps at random."""
    steps = np.arange(1, 2001)

    def plant(config: dict[str, Any]) -> Outcome:
        rng = np.random.default_rng(config["number"])
        clipped = steps <= 774 if config["params"]["optimizer"] == "adam" else rng.random(steps.size) < 0.7
        norms = np.where(clipped, 2.0, 0.5)
        cumulative = np.cumsum(clipped) / steps
        valid, train = planted.clean(config["number"], 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
        return Outcome(
            {
                "valid/error_rate": valid,
                "train/loss": train,
                "train/grad_norm": planted.Curve(steps, norms),
                "train/clipped_fraction": planted.Curve(steps, cumulative),
            }
        )

    body = spec("clipping", num_trials=6, scientific=ARMS)
    body["hyperparameters"].append({"name": "grad_clip_norm", "role": "fixed", "value": 1.0})
    study = create(client, body)
    run_pending(client, plant)
    result = analysis(client, study["id"])
    per_arm = {row["label"]: row for row in result["grad_clip"]["per_arm"]}
    assert math.isclose(per_arm["optimizer=adam"]["clipped_fraction"], 0.387)
    assert 0.65 < per_arm["optimizer=sgd"]["clipped_fraction"] < 0.75
    clip = [w for w in result["warnings"] if w["kind"] == "aggressive_clipping"]
    assert [w["trial_id"] for w in clip] == [per_arm["optimizer=sgd"]["trial_id"]]


def test_study_replicas_measure_noise_and_never_become_the_best(client: httpx.Client) -> None:
    """Two arms with the same true level and seed noise 0.01. Before replicas the verdict is
    unknown; after POST /studies/{id}/replicas it is within noise. Replicas are planted far better
    than any original: the study's best (GET /studies/{id}, studies.csv) stays an original."""
    originals: set[int] = set()

    def plant(config: dict[str, Any]) -> Outcome:
        noise = 0.01 * np.random.default_rng(config["seed"]).normal()
        bonus = 0.0 if config["trial_id"] in originals or not originals else -0.05
        level = 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2 + noise + bonus
        valid, train = planted.clean(config["number"], level, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("study-replicas", num_trials=6, scientific=ARMS))
    run_pending(client, plant)
    before = analysis(client, study["id"])
    assert before["comparison"]["verdict"] == "unknown"
    assert kinds(before) == ["replicas_recommended", "too_few_trials"]  # 6 trials per arm: too few to tell
    assert before["trial_variance"]["measured"] is False
    originals.update(t["id"] for t in client.get(f"{API}/studies/{study['id']}/trials").json()["items"])
    reply = client.post(f"{API}/studies/{study['id']}/replicas", json={"per_arm": 1, "count": 4})
    assert reply.status_code == 201 and len(reply.json()["trial_ids"]) == 8
    assert {s["trial_id"] for s in reply.json()["sources"]} == {a["best_trial_id"] for a in before["arms"]}
    assert client.post(f"{API}/studies/{study['id']}/replicas", json={"per_arm": 0, "count": 4}).status_code == 422
    assert run_pending(client, plant) == 8
    after = analysis(client, study["id"])
    assert all(a["n_replicas"] == 4 and a["replica_ci"] is not None for a in after["arms"])
    assert after["trial_variance"]["measured"] is True
    items = client.get(f"{API}/studies/{study['id']}/trials", params={"limit": 100}).json()["items"]
    seeds = [t["seed"] for t in items]
    replica_seeds = [t["seed"] for t in items if t["replica_of"] is not None]
    original_seeds = {t["seed"] for t in items if t["replica_of"] is None}
    assert len(set(replica_seeds)) == 8 and not set(replica_seeds) & original_seeds
    assert len(seeds) == 20
    shown = client.get(f"{API}/studies/{study['id']}").json()
    assert shown["best_trial_id"] in originals
    rows = list(csv.DictReader(io.StringIO(client.get(f"{API}/studies.csv").text)))
    (row,) = [r for r in rows if r["id"] == str(study["id"])]
    assert int(row["best_trial_id"]) in originals


def test_arms_far_apart_are_different_with_replicas(client: httpx.Client) -> None:
    def plant(config: dict[str, Any]) -> Outcome:
        noise = 0.002 * np.random.default_rng(config["seed"]).normal()
        offset = 0.05 if config["params"]["optimizer"] == "sgd" else 0.0
        valid, train = planted.clean(config["number"], 0.1 + offset + noise, noise=0.0005)
        return Outcome({"valid/error_rate": valid, "train/loss": train})

    study = create(client, spec("far-apart", num_trials=4, scientific=ARMS))
    run_pending(client, plant)
    assert client.post(f"{API}/studies/{study['id']}/replicas", json={"count": 3}).status_code == 201
    run_pending(client, plant)
    result = analysis(client, study["id"])
    cmp = result["comparison"]
    assert cmp["verdict"] == "different" and cmp["best_arm"] == "optimizer=adam" and cmp["ci"][0] > 0
    assert [a["rank"] for a in result["arms"]] == [1, 2] and result["arms"][0]["label"] == "optimizer=adam"
    assert kinds(result) == []


def test_checkpoint_records_follow_retention(client: httpx.Client) -> None:
    """A checkpoint record may name the steps whose files retention deleted: the server forgets
    them, so GET /trials/{id}/checkpoints lists only files that exist."""
    create(client, spec("retention", num_trials=1))
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8, "gpus": 0}}).json()
    tid, lease = claim["trial_id"], claim["lease_id"]
    for step, deleted in ((100, []), (200, []), (300, [100]), (400, [200, 999])):
        body = {"lease_id": lease, "step": step, "uri": f"ckpt/{step}.pt", "objective": 0.5, "deleted_steps": deleted}
        assert client.post(f"{API}/trials/{tid}/checkpoints", json=body).status_code == 201
    listed = client.get(f"{API}/trials/{tid}/checkpoints").json()
    assert sorted(c["step"] for c in listed) == [300, 400]
    bad = {"lease_id": lease, "step": 500, "uri": "x", "deleted_steps": [-1]}
    reply = client.post(f"{API}/trials/{tid}/checkpoints", json=bad)
    assert reply.status_code == 422 and "deleted_steps" in reply.text


def test_replica_seeds_never_collide_even_at_point_zero(client: httpx.Client) -> None:
    """Point 0's second arm once drew its replica seeds from its trial number (1), exactly those of
    point 1's replicas."""
    study = create(client, spec("seeds", num_trials=2, scientific=ARMS))
    items = client.get(f"{API}/studies/{study['id']}/trials").json()["items"]
    by_number = {t["number"]: t for t in items}
    for number in (1, 2):  # point 0's second arm, point 1's first arm
        assert client.post(f"{API}/trials/{by_number[number]['id']}/replicas", json={"count": 3}).status_code == 201
    items = client.get(f"{API}/studies/{study['id']}/trials", params={"limit": 100}).json()["items"]
    replica_seeds = [t["seed"] for t in items if t["replica_of"] is not None]
    assert len(replica_seeds) == 6 and len(set(replica_seeds)) == 6
    assert not set(replica_seeds) & {t["seed"] for t in items if t["replica_of"] is None}
