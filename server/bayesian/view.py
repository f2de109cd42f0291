"""What the analysis shows of a bayesian study (key `bayesian` of GET .../analysis): the best value
against trial number, and the latest model's view around the best point. The model view is the
one the refiller stored with its last proposal, so no model is fitted in a request."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select

from hpo.server.db import Database
from hpo.server.models import BayesianProposal, BayesianState, Study, Trial, TrialStatus


def bayesian_view(db: Database, study_id: int) -> dict[str, Any] | None:
    """None for a study that is not bayesian. Otherwise:

    - `best_so_far`: one entry per finished original trial in trial-number order, `{number,
      trial_id, value, best, source}`, `value` None when infeasible, `best` the best feasible value
      up to it, `source` "initial" (quasi-random) or the model that proposed it;
    - `model`: `{arm, observations, best_params, slices: [{name, scale, x, mean, std, feasible?}]}`,
      the objective predicted (mean and standard deviation, in the objective's units) along each
      hyperparameter through the best point, the others held there; None before the first fit;
    - `proposals`, `initial_trials`: how many trials the model proposed, how many were quasi-random."""
    with db.transaction() as session:
        study = session.get(Study, study_id)
        state = session.get(BayesianState, study_id)
        if study is None or state is None or study.algorithm != "bayesian":
            return None
        rows = session.execute(
            select(Trial.id, Trial.number, Trial.status, Trial.objective_value, BayesianProposal.model)
            .outerjoin(BayesianProposal, BayesianProposal.trial_id == Trial.id)
            .where(Trial.study_id == study_id, Trial.replica_of.is_(None))
            .where(Trial.status.in_([TrialStatus.completed, TrialStatus.infeasible]))
            .order_by(Trial.number)
        ).all()
        proposals = session.scalar(select(func.count()).where(BayesianProposal.study_id == study_id)) or 0
        sign = 1.0 if study.objective_mode == "min" else -1.0
        best: float | None = None
        series = []
        for row in rows:
            value = row.objective_value if row.status is TrialStatus.completed else None
            if value is not None and math.isfinite(value) and (best is None or sign * value < sign * best):
                best = value
            series.append(
                {
                    "number": row.number,
                    "trial_id": row.id,
                    "value": value,
                    "best": best,
                    "source": row.model or "initial",
                }
            )
        return {
            "best_so_far": series,
            "model": state.model_view,
            "proposals": int(proposals),
            "initial_trials": state.initial_trials,
        }
