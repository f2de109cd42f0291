"""Manual trials (`algorithm: "manual"`, and trials added to a study by hand): each checked once
against the arms and the search space, then drafted like laid-out trials."""

from __future__ import annotations

from typing import Any

from hpo.server.errors import FieldError, InvalidInput
from hpo.server.layout.quasi_random import TrialDraft, arms, trial_seed
from hpo.server.space.dimension import outside_reason
from hpo.server.spec.model import StudySpec


def manual_drafts(spec: StudySpec, trials: list[dict[str, Any]]) -> list[TrialDraft]:
    """Drafts for user-listed trials: each names values for the study's varied hyperparameters
    (the arm comes from its scientific values; fixed ones are filled in). Params outside the
    declared space are refused with the trial's index."""
    errors: list[FieldError] = []
    drafts = []
    for index, trial in enumerate(trials):
        params = dict(trial.get("params") or {})
        path = f"trials[{index}].params"
        arm = {hp.name: params.get(hp.name) for hp in spec.hyperparameters if hp.crossed}
        found = list(_manual_errors(spec, arm, params, path))
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


def _manual_errors(spec: StudySpec, arm: dict[str, Any], params: dict[str, Any], path: str) -> Any:
    if arm not in arms(spec):
        yield FieldError(path, f"scientific values {arm} are not an arm of this study")
        return
    applicable = {hp.name: hp for hp in spec.hyperparameters if hp.varied and not hp.crossed and hp.holds(arm)}
    fixed = {hp.name for hp in spec.hyperparameters if hp.role == "fixed"}
    crossed = {hp.name for hp in spec.hyperparameters if hp.crossed}
    for name, value in params.items():
        if name in crossed:
            continue
        if name in fixed:
            yield FieldError(f"{path}.{name}", "is fixed in this study")
        elif name not in applicable:
            yield FieldError(f"{path}.{name}", "is not a hyperparameter of this study for this arm")
        else:
            reason = outside_reason(applicable[name], value)
            if reason:
                yield FieldError(f"{path}.{name}", reason)
    for name in applicable:
        if name not in params:
            yield FieldError(f"{path}.{name}", "is missing")
