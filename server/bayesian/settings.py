"""The bayesian designer's settings read from a spec (its quasi-random start, its queue), and the
arm's search space it models. What `algorithm: "bayesian"` accepts is checked with the rest of the
spec (`hpo.server.spec.model`, which the layout and this package build on).

Decisions (docs/bayesian.md):
- Scientific hyperparameters must be categorical or discrete: their values are crossed into arms as
  in every study, and each arm gets its own model and `num_trials` trials, so the nuisance
  hyperparameters are optimized separately for each scientific value (the playbook's fair
  comparison, "Identifying scientific, nuisance, and fixed hyperparameters"). A continuous
  scientific hyperparameter is refused: the optimizer would go where the objective is best instead
  of covering the values to compare; make it nuisance, or list the values to compare as discrete.
- Each distinct varied name is one dimension of the unit cube the layout already defines (so a
  conditional name is modelled only in the arms where its `when` holds); categorical values keep
  the layout's unit-interval cells (value i is the cell [i/k, (i+1)/k)), and proposals are snapped
  to a cell's centre, as whole numbers are.
"""

from __future__ import annotations

from typing import Any

from hpo.server.space.search_space import ArmSpace
from hpo.server.spec.model import StudySpec, sampled_names

# Below about two observations per dimension (and never under five) a GP's hyperparameters are
# mostly prior: Ax's and Optuna's GP sampler's quasi-random start is of this size.
MIN_INITIAL = 5
INITIAL_PER_DIMENSION = 2


def initial_trials(spec: StudySpec, warm_observations: int = 0) -> int:
    """Quasi-random (Halton) trials per arm before the model proposes: the spec's
    `bayesian.initial_trials`, else max(5, 2 x dimensions) less the warm-start observations."""
    settings = spec.bayesian
    if settings is not None and settings.initial_trials is not None:
        return settings.initial_trials
    wanted = max(MIN_INITIAL, INITIAL_PER_DIMENSION * len(sampled_names(spec)))
    return min(spec.num_trials, max(0, wanted - warm_observations))


def queue_size(spec: StudySpec) -> int:
    return spec.bayesian.queue_size if spec.bayesian is not None else 2


def arm_space(spec: StudySpec, arm: dict[str, Any]) -> ArmSpace:
    """The dimensions modelled for an arm: each sampled name with a declaration that holds there."""
    names = sampled_names(spec)
    columns, declarations = [], []
    for column, name in enumerate(names):
        held = [hp for hp in spec.declarations(name) if hp.sampled and hp.holds(arm)]
        if held:
            columns.append(column)
            declarations.append(held[0])
    return ArmSpace(arm=arm, width=len(names), columns=columns, declarations=declarations)
