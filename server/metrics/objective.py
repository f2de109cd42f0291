"""A trial's objective: the best finite value of the study's objective metric over its
evaluations, with its step (retrospective checkpoint selection). Only the server computes it."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hpo.server.models import MetricPoint, Trial
from hpo.server.numbers import NonFinite


def refresh(session: Session, trial_id: int, metric: str, mode: str) -> tuple[float | None, int | None]:
    """Recomputes the trial's `objective_value` and `best_step` from its stored points (ties go
    to the earliest step) and answers them."""
    order = MetricPoint.value.asc() if mode == "min" else MetricPoint.value.desc()
    best = session.execute(
        select(MetricPoint.value, MetricPoint.step)
        .where(MetricPoint.trial_id == trial_id, MetricPoint.name == metric)
        .where(MetricPoint.nonfinite == NonFinite.finite)
        .order_by(order, MetricPoint.step)
        .limit(1)
    ).first()
    value, step = (best[0], best[1]) if best else (None, None)
    session.execute(update(Trial).where(Trial.id == trial_id).values(objective_value=value, best_step=step))
    return value, step
