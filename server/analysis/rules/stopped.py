"""Trials that stopped short of the study's training budget.

Playbook (002), "Deciding how long to train when training is not compute-bound" and "Identifying
bad search space boundaries": trials of one study are compared at the same budget. A trial that
completed at step 400 of 1,000 (an epoch-based script whose epochs depend on the batch size, a
crash that still exited 0, a script that ignores max_train_steps) was not trained as long as the
others: its value says little about where the optimum lies or how many trials the study needs, so
it is flagged and left out of the boundary and tuning-budget conclusions (and of the
max_train_steps advice), unless the study says its budget is per epoch (`trainer.budget_unit:
"epochs"`), where ending at different steps is the design."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hpo.server.analysis.model import TrialSummary, fmt, warning

# A trial is short when its last step is below this share of the reference step.
SHORT_SHARE = 0.95
# Without a trial that reached max_train_steps, the usual last step is this quantile of the
# completed trials' last steps (half the trials stopping early still leaves the others' end).
USUAL_QUANTILE = 0.75


def stopped_short(trials: Sequence[TrialSummary], settings: Mapping[str, Any]) -> dict[str, Any]:
    """`{reference_step, count, finished, trial_ids, per_epoch}`: the completed original trials
    whose last step is below `SHORT_SHARE` of the reference step: max_train_steps where some trial
    reached it, else the study's usual last step. `per_epoch` (the trainer setting `budget_unit`
    is `epochs`) keeps them in every conclusion."""
    done = [t for t in trials if t.status == "completed" and t.replica_of is None and t.last_step is not None]
    per_epoch = settings.get("budget_unit") == "epochs"
    empty: dict[str, Any] = {
        "reference_step": None,
        "count": 0,
        "finished": len(done),
        "trial_ids": [],
        "per_epoch": per_epoch,
    }
    if not done:
        return empty
    last = np.array([float(t.last_step or 0) for t in done])
    steps = settings.get("max_train_steps")
    if isinstance(steps, (int, float)) and not isinstance(steps, bool) and (last >= SHORT_SHARE * steps).any():
        reference = float(steps)
    else:
        reference = float(np.quantile(last, USUAL_QUANTILE))
    short = [t.id for t, s in zip(done, last, strict=True) if s < SHORT_SHARE * reference]
    return {**empty, "reference_step": reference, "count": len(short), "trial_ids": short}


def concluding(trials: Sequence[TrialSummary], short: Mapping[str, Any]) -> list[TrialSummary]:
    """The trials the boundary and budget conclusions may use: all but the ones that stopped
    short, unless the budget is per epoch."""
    if short["per_epoch"] or not short["count"]:
        return list(trials)
    left_out = set(short["trial_ids"])
    return [t for t in trials if t.id not in left_out]


def stopped_short_warnings(short: Mapping[str, Any], trials: Sequence[TrialSummary]) -> list[dict[str, Any]]:
    if not short["count"] or short["per_epoch"]:
        return []
    by_id = {t.id: t for t in trials}
    shown = ", ".join(f"{i} at step {fmt(by_id[i].last_step)}" for i in short["trial_ids"][:5])
    more = ", ..." if short["count"] > 5 else ""
    message = (
        f"{short['count']} of the {short['finished']} completed trials stopped before step "
        f"{fmt(short['reference_step'])} (trials {shown}{more}): they were trained for less than the others, so "
        "they are left out of the boundary, tuning-budget and max_train_steps conclusions. Find out why (a crash "
        "that exited 0, a script that stops by epoch); if the budget is per epoch, set trainer.budget_unit to "
        '"epochs".'
    )
    return [warning("stopped_short", message)]


def stopped_short_caveat(short: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not short["count"]:
        return []
    if short["per_epoch"]:
        message = (
            f"{short['count']} completed trials ended before step {fmt(short['reference_step'])}; the budget is per "
            "epoch (trainer.budget_unit), so they are compared with the others as they are."
        )
    else:
        message = (
            f"{short['count']} of {short['finished']} completed trials stopped before step "
            f"{fmt(short['reference_step'])} and are left out of the boundary, tuning-budget and max_train_steps "
            "conclusions."
        )
    return [{"param": "stopped_short", "value": short["count"], "when": None, "message": message}]
