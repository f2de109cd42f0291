"""The tracking sheet (pipeline guidance, "Setting up experiment tracking"): one row per study with
its name, a link to its config, a short description, the number of trials run, the validation
performance of the best checkpoint and a reproduction command. The best trial is the analysis' own
(`divergence.study_best`: never a replica, a diverged trial or a lone outlier evaluation)."""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select, text

from hpo.server.analysis import load
from hpo.server.analysis.judged import study_best
from hpo.server.analysis.model import TrialSummary
from hpo.server.db import Database
from hpo.server.models import Pipeline, Round, resumed

COLUMNS = (
    "study",
    "config",
    "description",
    "trials_run",
    "best_validation",
    "metric",
    "reproduce",
    "id",
    "best_trial_id",
    "best_trial_resumed",
    "pipeline",
    "round",
    "goal",
    "decision",
)

_ROWS = """
SELECT s.id, s.name, s.description, s.objective_metric AS metric, s.objective_mode AS mode, s.goal, s.round_id,
       sum(CASE WHEN t.status IN ('completed', 'infeasible', 'failed') THEN 1 ELSE 0 END) AS trials_run
FROM studies s LEFT JOIN trials t ON t.study_id = s.id
GROUP BY s.id, s.name, s.description, s.objective_metric, s.objective_mode, s.goal, s.round_id
ORDER BY s.id
"""


def tracking_rows(db: Database, base_url: str) -> list[dict[str, Any]]:
    """One dict per study (oldest first) with the sheet's `COLUMNS`; `base_url` (no trailing
    slash) makes the config link and the reproduction command absolute."""
    with db.transaction() as session:
        rows = session.execute(text(_ROWS)).all()
        best = {r.id: study_best(session, r.id) for r in rows}
        steps = load.resume_steps(session, [t.id for t in best.values() if t is not None])
        rounds = _rounds(session, {r.round_id for r in rows if r.round_id is not None})
    return [
        {
            **_row(r, best[r.id], base_url),
            "best_trial_resumed": _resumed_cell(best[r.id], steps),
            **_round_cells(r, rounds.get(r.round_id)),
        }
        for r in rows
    ]


def _resumed_cell(trial: TrialSummary | None, steps: Mapping[int, int]) -> str:
    """`true` when the study's best value came from an attempt resumed from a checkpoint."""
    if trial is None or trial.status != "completed":
        return ""
    return "true" if resumed(trial.best_step, steps.get(trial.id)) else "false"


def _rounds(session: Any, round_ids: set[int]) -> dict[int, Any]:
    """The rounds (docs/rounds.md) the studies belong to, with their pipeline's name."""
    if not round_ids:
        return {}
    query = select(Round, Pipeline.name).join(Pipeline, Pipeline.id == Round.pipeline_id)
    return {r.id: (r, name) for r, name in session.execute(query.where(Round.id.in_(round_ids)))}


def _round_cells(r: Any, found: Any) -> dict[str, Any]:
    """pipeline, round, goal (the round's, else the study's) and the round's decision."""
    if found is None:
        return {"pipeline": "", "round": "", "goal": r.goal or "", "decision": ""}
    round_row, pipeline = found
    decision = round_row.decision
    if decision is None:
        said = "open"
    elif decision.get("adopt"):
        said = f"adopted trial {decision.get('trial_id')} ({decision.get('verdict')})"
    else:
        said = f"kept the baseline ({decision.get('verdict')})"
    return {"pipeline": pipeline, "round": round_row.number, "goal": round_row.goal, "decision": said}


def tracking_csv(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV text with a header line."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _inert(v) for k, v in row.items()} for row in rows)
    return out.getvalue()


def _inert(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (OWASP "CSV Injection": leading = + - @,
    tab or CR) gets a leading quote; numbers stay numbers."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _row(r: Any, best_trial: TrialSummary | None, base_url: str) -> dict[str, Any]:
    best = None if best_trial is None or best_trial.status != "completed" else best_trial.objective
    best_trial_id = None if best is None or best_trial is None else best_trial.id
    file = shlex.quote(f"{r.name}.json")
    server = shlex.quote(base_url)
    reproduce = (
        f"hpo study show {r.id} --spec --server {server} > {file} && "
        f"hpo study create -f {file} --name {shlex.quote(r.name + '-rerun')} --server {server}"
    )
    return {
        "study": r.name,
        "config": f"{base_url}/api/v1/studies/{r.id}",
        "description": r.description,
        "trials_run": int(r.trials_run or 0),
        "best_validation": "" if best is None else best,
        "metric": r.metric,
        "reproduce": reproduce,
        "id": r.id,
        "best_trial_id": "" if best_trial_id is None else best_trial_id,
    }
