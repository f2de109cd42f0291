"""Hyperparameters that never reached the training script (docs/analysis.md, "Checks": `unread_hyperparameter`).

A command study's script gets its hyperparameters through placeholders of `trainer.command` or by
reading `hpo.session().params`; the worker reports the names that arrived by neither path
(`trials.unread_params`, worker/command.py). A name the script never reads trains every trial at
the script's own default for it, so whatever the study concludes about that name is about
nothing: the playbook's comparisons ("Determining whether to adopt a training pipeline change")
assume the hyperparameter really varied.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HOW_TO_PASS = (
    "pass it as a placeholder of trainer.command (--name={name}, or {args} for all) or read it from "
    "hpo.session().params (docs/scripts.md)"
)
EXAMPLES = 5


def trial_warnings(unread_params: Sequence[str] | None) -> list[dict[str, Any]]:
    """The trial's own warning, when its script never got some of its hyperparameters."""
    if not unread_params:
        return []
    names = ", ".join(unread_params)
    return [
        {
            "kind": "unread_hyperparameter",
            "params": list(unread_params),
            "message": (
                f"{names} never reached the script: no placeholder of trainer.command passed "
                f"{'them' if len(unread_params) > 1 else 'it'} and the script did not read "
                f"{'them' if len(unread_params) > 1 else 'it'} from hpo.session().params, so this trial trained "
                f"at the script's own default; {HOW_TO_PASS}"
            ),
        }
    ]


def study_warnings(
    unread: Mapping[int, Sequence[str]], numbers: Mapping[int, int], varied: Iterable[str]
) -> list[dict[str, Any]]:
    """One `unread_hyperparameter` warning per study: each name with how many trials missed it,
    varied names first (a varied name that never arrives makes its comparisons meaningless)."""
    if not unread:
        return []
    counts: Counter[str] = Counter(name for names in unread.values() for name in names)
    varied_names = set(varied)
    ordered = sorted(counts, key=lambda n: (n not in varied_names, -counts[n], n))
    trial_numbers = sorted(numbers.get(tid, tid) for tid in unread)
    listed = ", ".join(f"{name} ({counts[name]} trial{'s' if counts[name] != 1 else ''})" for name in ordered)
    which = [name for name in ordered if name in varied_names]
    consequence = (
        f"; the study varies {', '.join(which)}, so what it concludes about "
        f"{'them' if len(which) > 1 else 'it'} is about the script's default"
        if which
        else ""
    )
    return [
        {
            "kind": "unread_hyperparameter",
            "params": {name: counts[name] for name in ordered},
            "trials": len(unread),
            "trial_numbers": trial_numbers[:EXAMPLES],
            "message": (
                f"Hyperparameters that never reached the training script: {listed} (trials "
                f"{', '.join(map(str, trial_numbers[:EXAMPLES]))}{', …' if len(trial_numbers) > EXAMPLES else ''})"
                f"{consequence}. For each, {HOW_TO_PASS}"
            ),
        }
    ]
