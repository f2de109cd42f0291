"""Shared helpers for the bayesian tests: specs, and a worker that runs a planted function."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpo.server.db import Database
from hpo.server.metrics import ingest
from hpo.server.schemas import MetricPointIn
from hpo.server.trials import leases

Objective = Callable[[dict[str, Any]], float | None]  # None: the trial is infeasible


def bayesian_spec(name: str = "bo", num_trials: int = 12, **bayesian: Any) -> dict[str, Any]:
    """Two log-scale nuisance dimensions, the planted function's space."""
    spec: dict[str, Any] = {
        "name": name,
        "algorithm": "bayesian",
        "num_trials": num_trials,
        "seed": 1,
        "objective": {"metric": "valid/loss", "mode": "min"},
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-1, "scale": "log"},
        ],
    }
    if bayesian:
        spec["bayesian"] = bayesian
    return spec


def planted(params: dict[str, Any]) -> float:
    """A smooth bowl in log space, best at learning_rate=1e-2, weight_decay=1e-4."""
    a = math.log10(params["learning_rate"]) + 2
    b = math.log10(params["weight_decay"]) + 4
    return a * a + 0.5 * b * b


def run_one(db: Database, objective: Objective = planted) -> dict[str, Any] | None:
    """Claims one trial, reports the objective (or infeasible), finishes it; None when the claim
    answers nothing (an empty queue)."""
    claim = leases.claim(db, "w", 4, 0, 60)
    if claim is None:
        return None
    params = claim.config["params"]
    value = objective(params)
    if value is None:
        leases.fail(db, claim.trial_id, claim.lease_id, "infeasible", "diverged", 1)
    else:
        metric = claim.config["objective"]["metric"]
        ingest.record_metrics(db, claim.trial_id, claim.lease_id, [MetricPointIn(step=1, name=metric, value=value)])
        leases.complete(db, claim.trial_id, claim.lease_id)
    return {"trial_id": claim.trial_id, "params": params, "value": value}
