"""Replicas of each arm's best trials in one call (playbook 002, "Determining whether to adopt a
training pipeline change": rerun the best trial several times to measure trial variance before
concluding that one arm beats another). The trials to replicate are chosen as the analysis
chooses an arm's best: original, feasible (divergence judged from curves) trials, best first."""

from __future__ import annotations

from typing import Any

from hpo.server.analysis import load
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary, arm_label
from hpo.server.db import Database
from hpo.server.trials.reads import create_replicas


def replicate_best(db: Database, study_id: int, per_arm: int, count: int) -> dict[str, Any]:
    """Creates `count` replicas of the best `per_arm` trials of every arm; answers
    `{trial_ids, sources: [{arm, label, trial_id, replica_ids}]}`. Raises `NotFound` for an
    unknown study; an arm without a feasible trial gets none."""
    with db.transaction() as session:
        study = load.study_info(session, study_id)
        trials, _ = load_trials(session, study)
    sign = 1.0 if study.mode == "min" else -1.0
    groups: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.replica_of is None and t.feasible:
            groups.setdefault(t.arm_key, []).append(t)
    sources, created = [], []
    for group in groups.values():
        group.sort(key=lambda t: (sign * (t.objective or 0.0), t.number))
        for t in group[:per_arm]:
            ids = create_replicas(db, t.id, count)
            created += ids
            sources.append({"arm": dict(t.arm), "label": arm_label(t.arm), "trial_id": t.id, "replica_ids": ids})
    return {"trial_ids": created, "sources": sources}
