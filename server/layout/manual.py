"""Manual trials (`algorithm: "manual"`, and trials added to a study by hand): each checked once
against the arms and the search space, then drafted like laid-out trials."""

from __future__ import annotations

from typing import Any

from hpo.server.errors import FieldError, InvalidInput
from hpo.server.layout.quasi_random import TrialDraft, trial_seed
from hpo.server.spec.model import StudySpec
from hpo.server.spec.parse import manual_arm, manual_trial_errors


def manual_drafts(spec: StudySpec, trials: list[dict[str, Any]]) -> list[TrialDraft]:
    """Drafts for user-listed trials: each names values for the study's varied hyperparameters
    (the arm comes from its scientific values; fixed ones are filled in, and may be repeated).
    Params outside the declared space are refused with the trial's index, by the same check that
    refused them in the spec."""
    errors: list[FieldError] = []
    drafts = []
    for index, trial in enumerate(trials):
        params = dict(trial.get("params") or {})
        path = f"trials[{index}].params"
        arm = manual_arm(spec, params)
        found = manual_trial_errors(spec, params, path)
        errors += found
        if found:
            continue
        resolved = {
            **params,
            **{hp.name: hp.value for hp in spec.hyperparameters if hp.role == "fixed" and hp.holds(arm)},
        }
        seed = trial.get("seed")
        seed = trial_seed(spec.seed, 2**31 + index) if seed is None else int(seed)
        drafts.append(TrialDraft(arm, resolved, None, None, seed))
    if errors:
        raise InvalidInput(errors)
    return drafts
