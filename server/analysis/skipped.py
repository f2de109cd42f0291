"""The checks that abstained for want of evidence (docs/analysis.md, "The evidence each rule
needs": each rule abstains below the evidence it needs and says so under `skipped`). Each entry is
`{check, reason, trial_ids}`: the rule, what it had and what it needs (`"5 evaluations, needs 16"`,
`"needs train/loss"`), and the trials it would have judged (empty for a rule over an arm's trials).
Entries with the same check and reason are merged, so a study of 5-evaluation curves lists
high_variance once, not once per trial."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpo.server.analysis.model import Curve, TrialSummary
from hpo.server.analysis.rules.budget import MIN_TRIALS
from hpo.server.analysis.rules.curves import OBJECTIVE_TRAIN
from hpo.server.analysis.rules.diagnostics import TRAIN_LOGS_NEEDED, curve_needs
from hpo.server.analysis.rules.feasibility import neighbours_above_best
from hpo.server.analysis.rules.training import TOP_MIN
from hpo.server.space.search_space import Dimension, is_learning_rate

Skip = tuple[str, str, int | None]


def curve_skips(
    ranked: Sequence[Mapping[str, Any]], curves: Mapping[int, Mapping[str, Curve]], metric: str
) -> list[Skip]:
    """The curve rules (high_variance, still_improving, overfitting) that abstain on each of the
    best few trials per arm; a trial without its objective curve abstains from all of them."""
    out: list[Skip] = []
    for entry in ranked:
        series = curves.get(entry["trial_id"], {})
        for check, reason in curve_needs(series.get(metric), series.get(OBJECTIVE_TRAIN), OBJECTIVE_TRAIN):
            out.append((check, reason, entry["trial_id"]))
    return out


def best_step_skips(summary: Mapping[str, Any]) -> list[Skip]:
    """`max_train_steps` advice abstains in an arm whose judged trials (its better half) are fewer
    than `TOP_MIN`: so few best steps are too easily all early, or all late, by chance."""
    out: list[Skip] = []
    multi = len(summary.get("per_arm") or []) > 1
    for arm in summary.get("per_arm") or []:
        n = len(arm["trial_ids"])
        if n < TOP_MIN:
            where = f"arm {arm['label']}: " if multi else ""
            out.append(("max_train_steps", f"{where}{n} finished trials, needs {TOP_MIN}", None))
    return out


def budget_skips(arms: Sequence[Mapping[str, Any]], budget: Sequence[Mapping[str, Any]]) -> list[Skip]:
    """The tuning-budget rule (`too_few_trials`) abstains for an arm with fewer than `MIN_TRIALS`
    finished trials: the bootstrap of so few says nothing about whether more would help."""
    out: list[Skip] = []
    for entry in budget:
        if entry["n"] < MIN_TRIALS:
            where = f"arm {entry['label']}: " if len(arms) > 1 else ""
            out.append(("too_few_trials", f"{where}{entry['n']} finished trials, needs {MIN_TRIALS}", None))
    return out


def instability_skips(
    dims: Sequence[Dimension], trials: Sequence[TrialSummary], sign: float, train_curves: Mapping[int, Curve]
) -> list[Skip]:
    """The loss-instability rule reads the training loss of the trials just above each arm's best
    learning rate; it abstains on those that logged none, or fewer than `TRAIN_LOGS_NEEDED`."""
    out: list[Skip] = []
    for _, _, _, above in neighbours_above_best(dims, trials, sign):
        for t in above:
            curve = train_curves.get(t.id)
            logs = len(curve.finite()) if curve is not None else 0
            if logs == 0:
                out.append(("instability", f"needs {OBJECTIVE_TRAIN}", t.id))
            elif logs < TRAIN_LOGS_NEEDED:
                out.append(("instability", f"{logs} logs of {OBJECTIVE_TRAIN}, needs {TRAIN_LOGS_NEEDED}", t.id))
    return out


def name_skips(dims: Sequence[Dimension], trainer: Mapping[str, Any], grad: Sequence[Mapping[str, Any]]) -> list[Skip]:
    """The checks that read a name the study does not have (after `analysis.aliases`): the
    learning-rate rules need a learning rate among the hyperparameters, `long_warmup` a warmup
    setting, `aggressive_clipping` the gradient norms of the arms' best trials."""
    out: list[Skip] = []
    names = {d.name for d in dims} | set(trainer)
    if not any(is_learning_rate(n) for n in names):
        out.append(("instability", "needs learning_rate", None))
    if not names & {"warmup_steps", "lr_warmup_steps", "num_warmup_steps", "warmup_fraction", "warmup_ratio"}:
        out.append(("long_warmup", "needs warmup_steps or warmup_fraction", None))
    if grad and not any(g.get("n") for g in grad):
        out.append(("aggressive_clipping", "needs train/grad_norm", None))
    return out


def merged(entries: Iterable[Skip]) -> list[dict[str, Any]]:
    """One `{check, reason, trial_ids}` per check and reason, in first-seen order."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for check, reason, trial_id in entries:
        entry = out.setdefault((check, reason), {"check": check, "reason": reason, "trial_ids": []})
        if trial_id is not None and trial_id not in entry["trial_ids"]:
            entry["trial_ids"].append(trial_id)
    return list(out.values())
