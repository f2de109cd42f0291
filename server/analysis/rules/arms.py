"""The best trial per arm with the nuisance hyperparameters optimized away, trial variance measured
from replicas, and whether the best arms differ by more than it.

Playbook (002), "Detecting whether a change is useful with isolation plots": each point is the best
trial over the nuisance hyperparameters for one setting of the scientific ones. "Determining
whether to adopt a training pipeline change": trial variance (same hyperparameters, different
seeds) is measured by rerunning the best trial several times, and a change is adopted only when it
beats the baseline taking that variance into account.

Two pitfalls this module avoids:
- winner's curse: the original trial was *selected* as its arm's best, so its value is optimistic.
  Replica statistics (`replica_mean`, `replica_std`, `replica_ci`, `n_replicas`) use the replicas
  only, never the selected original;
- comparing a gap with the spread of single runs: the question is whether the *means* differ, so
  the difference of the two best arms' replica means gets a Welch confidence interval (the standard
  error of a difference of means shrinks with the number of replicas)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from hpo.server.analysis.model import TrialSummary, arm_label, fmt, warning

CONFIDENCE = 0.95
# Power for the replicas advice: replicas per arm to resolve a gap at 95% confidence, 80% power.
_Z_POWER = 1.96 + 0.84


def arm_summaries(trials: Sequence[TrialSummary], sign: float) -> list[dict[str, Any]]:
    """One entry per arm, ranked (`rank` 1 = best): by replica mean where the arm's best trial has
    finished replicas, else by its best value. Each holds its best trial among the original
    (non-replica) feasible trials, counts, and the replica statistics of that best trial."""
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        groups.setdefault(t.arm_key, []).append(t)
    replicas_of: dict[int, list[TrialSummary]] = {}
    for t in trials:
        if t.replica_of is not None:
            replicas_of.setdefault(t.replica_of, []).append(t)
    summaries = [_summary(group, replicas_of, sign) for group in groups.values()]
    summaries.sort(key=lambda a: (_score(a) is None, sign * (_score(a) or 0.0), a["label"]))
    for rank, a in enumerate(summaries, 1):
        a["rank"] = rank
    return summaries


def _score(arm: Mapping[str, Any]) -> float | None:
    return arm["replica_mean"] if arm["replica_mean"] is not None else arm["best_value"]


def _summary(group: list[TrialSummary], replicas_of: Mapping[int, list[TrialSummary]], sign: float) -> dict[str, Any]:
    originals = [t for t in group if t.replica_of is None]
    feasible = [t for t in originals if t.feasible]
    best = min(feasible, key=lambda t: (sign * (t.objective or 0.0), t.number)) if feasible else None
    counts = {s: sum(t.status == s for t in originals) for s in ("completed", "running", "pending", "failed")}
    return {
        "arm": dict(group[0].arm),
        "label": arm_label(group[0].arm),
        "best_trial_id": best.id if best else None,
        "best_value": best.objective if best else None,
        "best_step": best.best_step if best else None,
        "best_params": dict(best.params) if best else None,
        "n_trials": len(originals),
        "n_completed": counts["completed"],
        "n_infeasible": sum(t.infeasible for t in originals),
        "n_failed": counts["failed"],
        "n_unfinished": counts["running"] + counts["pending"],
        **replica_stats(replicas_of.get(best.id, []) if best else [], original=best),
    }


def identical_runs(runs: Sequence[Any]) -> bool:
    """Whether two or more runs of one configuration with different seeds returned the same result
    (bit for bit; each run its `(value, best_step)`, so two runs tied by chance on a coarse metric
    at different steps are not taken for one): the seed does not reach the training code, so the
    runs cannot measure trial variance (docs/analysis.md, "Noise"). Used by the analysis' comparison and by the
    rounds' evidence alike."""
    return len(runs) >= 2 and len(set(runs)) == 1


def seed_ignored_message(label: str, trial_id: int | None, n_runs: int, value: float | None) -> str:
    """The `seed_ignored` warning's text: what happened, why it matters and how to pass the seed."""
    which = f"trial {trial_id} and its replicas" if trial_id is not None else "its reruns"
    return (
        f"{label}: {n_runs} runs of one configuration with different seeds ({which}) returned the identical value "
        f"{fmt(value)}: the seed does not reach the training code, so replicas cannot measure trial variance and no "
        'comparison is made (the verdict is `unknown`). Pass the seed to the script: read config["seed"] from '
        'HPO_CONFIG, or put the {seed} placeholder in trainer.command (docs/scripts.md, "What replicas need"), then '
        "replicate again."
    )


def replica_stats(replicas: Sequence[TrialSummary], original: TrialSummary | None = None) -> dict[str, Any]:
    """Statistics of the finished replicas of one trial, the selected original excluded:
    `n_replicas` (feasible ones), `n_replicas_infeasible`, `n_replicas_failed` (diverged,
    infeasible or failed) and `replicas_diverged` (`"k of n diverged"` over the finished ones),
    `replica_values`, `replica_mean` (one or more), `replica_std` and `replica_ci` (a t interval of
    the mean; two or more), all over the surviving replicas. `seed_ignored`: the replicas (with
    `original`, when it is feasible) are two or more runs that returned identical values
    (`identical_runs`); `replica_std` and `replica_ci` are then None (nothing was measured)."""
    values = [float(t.objective or 0.0) for t in replicas if t.feasible]
    kept = [t for t in replicas if t.feasible]
    if original is not None and original.feasible and kept:
        kept.append(original)
    ignored = identical_runs([(float(t.objective or 0.0), t.best_step) for t in kept])
    n = len(values)
    # Playbook (002), "Determining whether to adopt a training pipeline change": a replica is a rerun
    # of the same configuration, so one that diverges or fails is a property of that configuration
    # (docs/analysis.md, "Noise": a replica that diverges counts against its configuration), never left out silently.
    failed = sum(t.infeasible or t.status == "failed" for t in replicas)
    finished = n + failed
    mean = float(np.mean(values)) if n else None
    std = float(np.std(values, ddof=1)) if n >= 2 and not ignored else None
    ci = None
    if n >= 2 and mean is not None and std is not None:
        half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
        ci = [mean - half, mean + half]
    return {
        "n_replicas": n,
        "n_replicas_infeasible": sum(t.infeasible for t in replicas),
        "n_replicas_failed": failed,
        "replicas_diverged": f"{failed} of {finished} diverged" if finished else None,
        "replica_values": values,
        "replica_mean": mean,
        "replica_std": std,
        "replica_ci": ci,
        "seed_ignored": ignored,
    }


def comparison(arms: Sequence[Mapping[str, Any]], sign: float) -> dict[str, Any] | None:
    """The two best-ranked arms compared: `difference` (runner-up minus best, oriented so positive
    means the best arm is better, in the metric's units), its Welch confidence interval and the
    verdict: `unstable` when either arm's replicas diverged or failed (`unstable_arms`; a comparison
    of the survivors would hide a configuration that fails one run in k), `unknown` when either
    arm's runs returned identical values (`seed_ignored_arms`: the seed does not reach the training
    code, so no Welch test runs on a zero variance), else `different` when the
    interval excludes 0, `within_noise` when it does not, `unknown` without two replicas of each
    (trial variance unmeasured). None with fewer than two arms."""
    ranked = [a for a in arms if a["best_value"] is not None]
    if len(ranked) < 2:
        return None
    best, runner = ranked[0], ranked[1]
    out: dict[str, Any] = {
        "best_arm": best["label"],
        "runner_up": runner["label"],
        "difference": sign * (_score(runner) - _score(best)),  # type: ignore[operator]
        "ci": None,
        "verdict": "unknown",
        "method": None,
        "p_value": None,
    }
    a, b = best["replica_values"], runner["replica_values"]
    unstable = [arm["label"] for arm in (best, runner) if arm.get("n_replicas_failed")]
    ignored = [arm["label"] for arm in (best, runner) if arm.get("seed_ignored")]
    out["seed_ignored_arms"] = ignored
    if ignored and not unstable:
        return out
    if len(a) < 2 or len(b) < 2 or ignored:
        return {**out, "verdict": "unstable", "unstable_arms": unstable} if unstable else out
    va, vb = float(np.var(a, ddof=1)) / len(a), float(np.var(b, ddof=1)) / len(b)
    diff = sign * (float(np.mean(b)) - float(np.mean(a)))
    se = math.sqrt(va + vb)
    if se == 0:
        dof, half, p = float("inf"), 0.0, 0.0 if diff else 1.0
    else:
        dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va + vb > 0 else float("inf")
        half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof)) * se
        p = float(2 * stats.t.sf(abs(diff) / se, dof))
    lo, hi = diff - half, diff + half
    out.update(
        difference=diff,
        ci=[lo, hi],
        verdict="unstable" if unstable else "different" if lo > 0 or hi < 0 else "within_noise",
        unstable_arms=unstable,
        method="welch",
        p_value=p,
        pooled_std=math.sqrt((float(np.var(a, ddof=1)) + float(np.var(b, ddof=1))) / 2),
    )
    return out


def trial_variance(arms: Sequence[Mapping[str, Any]], eval_noise: float | None) -> dict[str, Any]:
    """Whether trial variance was measured (some arm's best trial has two or more replicas), the
    evaluation noise estimated from late curves (a lower bound on it, always available), and a
    sentence that says which."""
    measured = [a for a in arms if a["replica_std"] is not None and not a.get("seed_ignored")]
    if measured:
        spread = ", ".join(f"{a['label']}: {fmt(a['replica_std'])} ({a['n_replicas']} replicas)" for a in measured)
        message = f"Trial variance measured from replicas of each arm's best trial (std {spread})."
    else:
        noise = f" Evaluation noise alone, from late training curves, is about {fmt(eval_noise)}." if eval_noise else ""
        message = (
            "Trial variance is unmeasured: no trial has two or more finished replicas, so the differences between "
            f"trials and arms carry no uncertainty.{noise} Replicate the best trial of each arm "
            "(POST /api/v1/studies/{id}/replicas) to measure it."
        )
    return {"measured": bool(measured), "eval_noise_std": eval_noise, "message": message}


def comparison_warnings(
    cmp: Mapping[str, Any] | None, arms: Sequence[Mapping[str, Any]], study_id: int
) -> list[dict[str, Any]]:
    """`within_noise` when replicas show the two best arms are not clearly different, and
    `replicas_recommended` whenever they are not shown different (no replicas yet, or too few);
    `seed_ignored` for each arm whose runs returned identical values (instead of
    `replicas_recommended`: more replicas cannot help until the seed reaches the script)."""
    ignored = [seed_ignored_warning(a) for a in arms if a.get("seed_ignored")]
    if cmp is None or cmp["verdict"] == "different":
        return ignored
    if cmp["verdict"] == "unstable":
        return [_unstable_warning(a) for a in arms[:2] if a.get("n_replicas_failed")] + ignored
    if ignored:
        return ignored  # more replicas cannot help until the seed reaches the training code
    out = []
    best, runner = cmp["best_arm"], cmp["runner_up"]
    if cmp["verdict"] == "within_noise":
        lo, hi = cmp["ci"]
        out.append(
            warning(
                "within_noise",
                f"Arm {best} beats arm {runner} by {fmt(cmp['difference'])} on average over their replicas, but the "
                f"{CONFIDENCE:.0%} confidence interval of the difference, [{fmt(lo)}, {fmt(hi)}] (Welch, p = "
                f"{cmp['p_value']:.2g}), includes 0: the difference may be trial variance. Treat the arms as tied, or "
                "run more replicas before adopting the change.",
            )
        )
    have = min((a["n_replicas"] for a in arms[:2]), default=0)
    need = _replicas_needed(cmp)
    more = f" About {need} replicas per arm would resolve a gap of this size." if need else ""
    text = (
        f"Arms {best} and {runner} are not clearly different ("
        + ("trial variance is unmeasured" if cmp["verdict"] == "unknown" else f"only {have} replicas each")
        + f"): replicate the best trial of each arm before concluding (POST /api/v1/studies/{study_id}/replicas "
        + '{"per_arm": 1, "count": 5}).'
        + more
    )
    out.append(warning("replicas_recommended", text))
    return out


def seed_ignored_warning(arm: Mapping[str, Any]) -> dict[str, Any]:
    """`seed_ignored` for an arm whose best trial and replicas returned identical values."""
    values = arm["replica_values"]
    n = len(values) + (1 if arm.get("best_value") is not None and values else 0)
    message = seed_ignored_message(f"Arm {arm['label']}", arm.get("best_trial_id"), n, values[0] if values else None)
    return warning("seed_ignored", message, trial_id=arm.get("best_trial_id"))


def _unstable_warning(arm: Mapping[str, Any]) -> dict[str, Any]:
    message = (
        f"Arm {arm['label']}: {arm['replicas_diverged']} of the replicas of its best trial "
        f"{arm['best_trial_id']}: the configuration is unstable, so comparing its surviving replicas with another "
        "arm's would hide how often it fails (the verdict is `unstable`). Make it stable first (learning-rate "
        'warmup, gradient clipping or a lower learning rate; playbook, "Identifying unstable workloads"), or count '
        "its failure rate against it."
    )
    return warning("replicas_diverged", message, trial_id=arm["best_trial_id"])


def _replicas_needed(cmp: Mapping[str, Any]) -> int | None:
    std, diff = cmp.get("pooled_std"), abs(cmp["difference"] or 0.0)
    if not std or not diff:
        return None
    return max(2, math.ceil(2 * (_Z_POWER * std / diff) ** 2))
