"""A round's candidate, the evidence for it against the baseline, its replicas and the decision
(playbook 002, "Determining whether to adopt a training pipeline change"; docs/rounds.md).

- The *candidate* is the best feasible original trial of the round's own studies, by the analysis'
  rules (`analysis.divergence.load_trials`: diverged trials and lone outlier evaluations set aside,
  replicas never; ties by trial id, as `study_best`).
- The *evidence* compares the candidate's replicas (the selected original left out: winner's
  curse) with reruns of the baseline configuration under the candidate study's trainer settings
  (the round's baseline studies), with the analysis' own statistics (`arms.replica_stats`) and
  Welch comparison (`arms.comparison`). A rerun that diverged or failed counts against its
  configuration: the verdict is then `unstable`.
- Adopting appends a launch and moves the baseline; on any verdict but `better` it needs
  `override` and a note (the playbook: weigh the gain against the complexity the change adds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from hpo.policy import ExecutionPolicy
from hpo.server.analysis import load
from hpo.server.analysis.judged import load_trials
from hpo.server.analysis.model import TrialSummary, fmt
from hpo.server.analysis.rules.arms import CONFIDENCE, comparison, replica_stats, seed_ignored_message
from hpo.server.db import Database
from hpo.server.errors import Conflict, InvalidInput
from hpo.server.models import Launch, Pipeline, Round, Study
from hpo.server.rounds.pipelines import launch_public, round_studies, round_summary
from hpo.server.rounds.recipes import recipe_views
from hpo.server.studies import service as studies
from hpo.server.studies.from_baseline import pipeline_or_404, round_or_404
from hpo.server.trials import reads as trials

VERDICTS = ("better", "within_noise", "worse", "unstable", "unknown")


def get_round(db: Database, round_id: int) -> dict[str, Any]:
    """The round with its studies, its candidate, the evidence and its recipes' readouts."""
    with db.transaction() as session:
        row = round_or_404(session, round_id)
        pipeline = pipeline_or_404(session, row.pipeline_id)
        found, evidence = evaluate(session, pipeline, row)
        return {
            **round_summary(session, row),
            "pipeline": {"id": pipeline.id, "name": pipeline.name, "baseline_params": pipeline.baseline_params},
            "studies": [_study_view(session, s) for s in round_studies(session, row.id)],
            "baseline_study_ids": [s.id for s in round_studies(session, row.id, "baseline")],
            "candidate": found.view if found else None,
            "evidence": evidence,
            "recipes": recipe_views(session, row.id),
        }


def _study_view(session: Session, study: Study) -> dict[str, Any]:
    view = studies.get_study_in(session, study.id)
    return {
        "id": view.id,
        "name": view.name,
        "status": view.status,
        "best_trial_id": view.best_trial_id,
        "best_value": view.best_value,
        "trial_counts": view.trial_counts.model_dump(),
    }


class Candidate:
    """The round's best feasible original trial, its study and that study's trial summaries."""

    def __init__(self, trial: TrialSummary, study: load.StudyInfo, trials_: list[TrialSummary]) -> None:
        self.trial, self.study, self.trials = trial, study, trials_

    @property
    def trainer(self) -> dict[str, Any]:
        return dict(self.study.spec.get("trainer") or {})

    @property
    def view(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial.id,
            "study_id": self.study.id,
            "params": dict(self.trial.params),
            "arm": dict(self.trial.arm),
            "objective": self.trial.objective,
            "best_step": self.trial.best_step,
        }


def find_candidate(session: Session, round_row: Round, sign: float) -> Candidate | None:
    """The best feasible original trial over the round's own studies (not its baseline reruns)."""
    best: Candidate | None = None
    for study in round_studies(session, round_row.id):
        info = load.study_info(session, study.id)
        summaries, _ = load_trials(session, info)
        trial = best_feasible(summaries, sign)
        if trial is not None and (best is None or _key(trial, sign) < _key(best.trial, sign)):
            best = Candidate(trial, info, summaries)
    return best


def best_feasible(summaries: Sequence[TrialSummary], sign: float) -> TrialSummary | None:
    """`divergence.study_best`'s choice restricted to finished trials: the best feasible original."""
    usable = [t for t in summaries if t.replica_of is None and t.feasible]
    return min(usable, key=lambda t: _key(t, sign), default=None)


def _key(t: TrialSummary, sign: float) -> tuple[float, int]:
    return (sign * float(t.objective or 0.0), t.id)


def evaluate(session: Session, pipeline: Pipeline, round_row: Round) -> tuple[Candidate | None, dict[str, Any]]:
    """The candidate (None without one) and the evidence for it against the baseline."""
    sign = 1.0 if pipeline.objective_mode == "min" else -1.0
    found = find_candidate(session, round_row, sign)
    if found is None:
        return None, {
            "verdict": "unknown",
            "missing": ["candidate"],
            "message": "No candidate yet: none of the round's studies has a finished feasible trial.",
        }
    replicas = [t for t in found.trials if t.replica_of == found.trial.id]
    base_studies, base_trials = baseline_runs(session, round_row, pipeline, found.trainer)
    return found, compare(found, replicas, base_trials, [s.id for s in base_studies], sign)


def baseline_runs(
    session: Session, round_row: Round, pipeline: Pipeline, trainer: Mapping[str, Any]
) -> tuple[list[Study], list[TrialSummary]]:
    """The round's reruns of the *current* baseline under `trainer` (the candidate study's
    settings): a rerun of an older baseline, or under other settings, is no evidence."""
    matching, runs = [], []
    for study in round_studies(session, round_row.id, "baseline"):
        if dict(study.spec.get("trainer") or {}) != dict(trainer):
            continue
        summaries, _ = load_trials(session, load.study_info(session, study.id))
        if summaries and dict(summaries[0].params) != dict(pipeline.baseline_params):
            continue
        matching.append(study)
        runs += summaries
    return matching, runs


def compare(
    found: Candidate,
    replicas: Sequence[TrialSummary],
    baseline: Sequence[TrialSummary],
    baseline_study_ids: list[int],
    sign: float,
) -> dict[str, Any]:
    """The evidence: both samples (`sample`), the analysis' Welch comparison of their means, and
    the round's verdict (`verdict_of`)."""
    cand = {
        "label": "candidate",
        "trial_id": found.trial.id,
        "best_value": found.trial.objective,
        **replica_stats(replicas, original=found.trial),
    }
    base = replica_stats(baseline)
    base_arm = {"label": "baseline", "best_value": base["replica_mean"], **base}
    cmp = comparison([cand, base_arm], sign)
    verdict = verdict_of(cmp, cand, base_arm)
    sides = (("candidate replicas", cand), ("baseline replicas", base))
    missing = [name for name, arm in sides if len(arm["replica_values"]) < 2]
    return {
        "candidate": sample(cand, replicas, found.trial.id),
        "baseline": {**sample(base, baseline, None), "study_ids": baseline_study_ids},
        "difference": cmp["difference"] if cmp else None,
        "ci": cmp["ci"] if cmp else None,
        "confidence": CONFIDENCE,
        "method": cmp["method"] if cmp else None,
        "p_value": cmp["p_value"] if cmp else None,
        "verdict": verdict,
        "missing": missing if verdict == "unknown" else [],
        "seed_ignored": [name for name, arm in sides if arm["seed_ignored"]],
        "message": _message(verdict, cmp, cand, base, missing),
    }


def sample(stats: Mapping[str, Any], runs: Sequence[TrialSummary], trial_id: int | None) -> dict[str, Any]:
    """One side of the evidence in the API's shape."""
    return {
        "trial_id": trial_id,
        "n": stats["n_replicas"],
        "mean": stats["replica_mean"],
        "std": stats["replica_std"],
        "ci": stats["replica_ci"],
        "values": stats["replica_values"],
        "diverged": _failed(stats, runs),
        "pending": sum(t.status in ("pending", "running") for t in runs),
    }


def _failed(stats: Mapping[str, Any], runs: Sequence[TrialSummary]) -> int:
    """Reruns that diverged or failed (`replica_stats` counts them; the same rule otherwise)."""
    if "n_replicas_failed" in stats:
        return int(stats["n_replicas_failed"])
    return sum(t.infeasible or t.status == "failed" for t in runs)


def verdict_of(cmp: Mapping[str, Any] | None, cand: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The round's verdict from the analysis' comparison of candidate (ranked first) and baseline:
    `unstable` when a rerun of either diverged or failed, `better`/`worse` when the interval of
    the difference excludes 0 (positive: the candidate is better), `within_noise` when it does
    not, `unknown` without two finished reruns of each or when either side's runs returned
    identical values (`arms.identical_runs`: the seed does not reach the training code)."""
    if any(_failed(arm, []) for arm in (cand, base)):
        return "unstable"
    if cmp is None or cmp["verdict"] in ("unknown", "unstable"):
        return "unknown" if cmp is None or cmp["verdict"] == "unknown" else "unstable"
    if cmp["verdict"] == "within_noise":
        return "within_noise"
    return "better" if cmp["difference"] > 0 else "worse"


def _message(
    verdict: str, cmp: Mapping[str, Any] | None, cand: Mapping[str, Any], base: Mapping[str, Any], missing: list[str]
) -> str:
    if verdict == "unknown" and (cand["seed_ignored"] or base["seed_ignored"]):
        side, runs, trial_id = (
            ("The candidate", [*cand["replica_values"], cand["best_value"]], cand.get("trial_id"))
            if cand["seed_ignored"]
            else ("The baseline", base["replica_values"], None)
        )
        return seed_ignored_message(side, trial_id, len(runs), runs[0])
    if verdict == "unknown":
        return (
            f"Trial variance is unmeasured ({', '.join(missing) or 'a comparison'} missing): run the candidate and the "
            'baseline several times (POST /api/v1/rounds/{id}/replicas {"count": 5}) before deciding.'
        )
    if verdict == "unstable":
        return (
            f"Reruns diverged or failed (candidate: {_failed(cand, [])}, baseline: {_failed(base, [])}): the "
            'configuration is unstable, which counts against it (playbook, "Identifying unstable workloads").'
        )
    assert cmp is not None and cmp["ci"] is not None
    lo, hi = cmp["ci"]
    gap = f"{fmt(cmp['difference'])} ({CONFIDENCE:.0%} interval [{fmt(lo)}, {fmt(hi)}], Welch)"
    if verdict == "within_noise":
        return f"The candidate differs from the baseline by {gap}: within trial variance."
    return f"The candidate is {verdict} than the baseline by {gap}."


# --- replicas --------------------------------------------------------------------------------------


def replicate(db: Database, round_id: int, count: int, policy: ExecutionPolicy | None = None) -> dict[str, Any]:
    """`count` new seeds of the candidate (replicas in its study) and of the baseline configuration
    (a baseline study of the round under the candidate study's trainer settings, created or grown),
    in one transaction. `Conflict` when the round has no candidate yet."""
    with db.transaction() as session:
        row = round_or_404(session, round_id, lock=True)
        pipeline = pipeline_or_404(session, row.pipeline_id)
        sign = 1.0 if pipeline.objective_mode == "min" else -1.0
        found = find_candidate(session, row, sign)
        if found is None:
            raise Conflict(
                f"round {row.id} has no candidate to replicate: none of its studies has a finished feasible trial yet"
            )
        candidate_ids = trials.add_replicas(session, found.trial.id, count)
        base_studies, _ = baseline_runs(session, row, pipeline, found.trainer)
        if base_studies:
            study = base_studies[-1]
            studies.grow(session, study.id, study.num_trials + count)
            study_id = study.id
        else:
            study_id = _baseline_study(session, row, pipeline, found, count, policy)
        baseline_ids = studies.trial_ids(session, study_id)
    return {
        "candidate_trial_id": found.trial.id,
        "candidate_replica_ids": candidate_ids,
        "baseline_study_id": study_id,
        "baseline_trial_ids": baseline_ids[-count:],
    }


def _baseline_study(
    session: Session, row: Round, pipeline: Pipeline, found: Candidate, count: int, policy: ExecutionPolicy | None
) -> int:
    existing = len(round_studies(session, row.id, "baseline"))
    spec = found.study.spec
    raw = {
        "name": f"{pipeline.name}-round{row.number}-baseline{existing + 1}",
        "description": f"Reruns of the baseline of pipeline {pipeline.name!r} beside the candidate of round "
        f"{row.number} (trial {found.trial.id}), under the candidate study's trainer settings.",
        "goal": row.goal,
        "round_id": row.id,
        "algorithm": "halton",
        "num_trials": count,
        "seed": int(spec.get("seed", 0)) + 1,
        "trainer": dict(spec.get("trainer") or {}),
        "resources": dict(spec.get("resources") or {}),
        "max_attempts": spec.get("max_attempts", 3),
    }
    try:
        _, study_id = studies.create_in_round(session, raw, policy, role="baseline")
    except InvalidInput as exc:  # the baseline no longer fits the candidate's settings
        raise Conflict(f"cannot rerun the baseline under the candidate study's settings: {exc.message}") from None
    return study_id


# --- the decision ----------------------------------------------------------------------------------


def decide(db: Database, round_id: int, adopt: bool, note: str, override: bool) -> dict[str, Any]:
    """Records the round's decision; adopting appends a launch and moves the pipeline's baseline to
    the candidate's params. `Conflict` (409) when the round was decided already, has no candidate,
    or when adopting on a verdict other than `better` without `override` and a note."""
    with db.transaction() as session:
        row = round_or_404(session, round_id, lock=True)
        if row.decision is not None:
            raise Conflict(f"round {row.id} is decided already (adopt: {row.decision.get('adopt')})")
        pipeline = pipeline_or_404(session, row.pipeline_id, lock=True)
        found, evidence = evaluate(session, pipeline, row)
        if found is None:
            raise Conflict(f"round {row.id} has no candidate to decide on: {evidence['message']}")
        verdict = evidence["verdict"]
        if adopt and verdict != "better" and not (override and note.strip()):
            raise Conflict(
                f"the evidence's verdict is {verdict!r}, not 'better': adopting anyway needs \"override\": true and a "
                'note saying why the change is worth it (playbook, "Determining whether to adopt a training '
                f'pipeline change": weigh the gain against the complexity it adds). {evidence["message"]}'
            )
        decided_at = datetime.now(UTC).isoformat()
        row.decision = {
            "adopt": adopt,
            "note": note,
            "override": bool(override and adopt and verdict != "better"),
            "verdict": verdict,
            "trial_id": found.trial.id,
            "decided_at": decided_at,
        }
        launch = _launch(session, pipeline, row, found, evidence, note) if adopt else None
        return {**round_summary(session, row), "evidence": evidence, "launch": launch}


def _launch(
    session: Session, pipeline: Pipeline, row: Round, found: Candidate, evidence: dict[str, Any], note: str
) -> dict[str, Any]:
    after = {"value": found.trial.objective, **_measured(evidence["candidate"])}
    launch = Launch(
        pipeline_id=pipeline.id,
        round_id=row.id,
        trial_id=found.trial.id,
        params_before=dict(pipeline.baseline_params),
        params_after=dict(found.trial.params),
        objective_before=pipeline.baseline_objective or _measured(evidence["baseline"]),
        objective_after=after,
        evidence=evidence,
        note=note,
    )
    session.add(launch)
    pipeline.baseline_params = dict(found.trial.params)
    pipeline.baseline_trial_id, pipeline.baseline_round_id = found.trial.id, row.id
    pipeline.baseline_objective = after
    session.flush()
    session.refresh(launch)
    return launch_public(launch)


def _measured(side: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("mean", "std", "n", "values", "diverged")
    return {k: side.get(k) for k in keys}
