"""A round's study from its pipeline (docs/rounds.md): the pipeline's objective and trainer
settings, and every baseline hyperparameter the spec does not mention fixed at the baseline's
value; and finding a pipeline or a round by id."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpo.server.errors import InvalidInput, NotFound
from hpo.server.models import Pipeline, Round

# Trainer keys that belong to a user program; a study naming a workload drops them, and the reverse.
COMMAND_ONLY = ("command", "workdir", "env", "silence_timeout_seconds")


def pipeline_or_404(session: Session, pipeline_id: int, *, lock: bool = False) -> Pipeline:
    query = select(Pipeline).where(Pipeline.id == pipeline_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"pipeline {pipeline_id} not found")
    return row


def round_or_404(session: Session, round_id: int, *, lock: bool = False) -> Round:
    query = select(Round).where(Round.id == round_id)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"round {round_id} not found")
    return row


def expand_spec(session: Session, raw: dict[str, Any]) -> tuple[dict[str, Any], Round]:
    """The study spec a round's study runs: `raw` with the pipeline's objective, its trainer
    settings under the spec's own, and every baseline hyperparameter the spec does not mention
    fixed at the baseline's value (`source: "baseline"`). Raises `InvalidInput` naming `round_id`
    for an unknown round (a field of the body, not the resource asked for: 422, not 404), and for a
    `pipeline_id` or an objective that is not the round's pipeline's."""
    round_id = _round_id(raw)
    try:
        round_row = round_or_404(session, round_id)
    except NotFound:
        raise InvalidInput.one(
            "round_id", f"no round {round_id}: create one with POST /api/v1/pipelines/{{id}}/rounds"
        ) from None
    pipeline = pipeline_or_404(session, round_row.pipeline_id)
    given_pipeline = raw.get("pipeline_id")
    if given_pipeline is not None and given_pipeline != pipeline.id:
        raise InvalidInput.one(
            "round_id",
            f"round {round_row.id} belongs to pipeline {pipeline.id} ({pipeline.name!r}), not to pipeline "
            f"{given_pipeline}",
        )
    objective = {"metric": pipeline.objective_metric, "mode": pipeline.objective_mode}
    if "objective" in raw and _objective_of(raw["objective"]) != objective:
        raise InvalidInput.one(
            "objective", f"must be the pipeline's objective {objective} (a round's studies are compared on it)"
        )
    trainer = merged_trainer(pipeline.trainer, raw.get("trainer"))
    hyperparameters = list(raw.get("hyperparameters") or [])
    mentioned = {hp.get("name") for hp in hyperparameters if isinstance(hp, dict)} | set(trainer)
    hyperparameters += [
        {"name": name, "role": "fixed", "value": value, "source": "baseline"}
        for name, value in sorted(pipeline.baseline_params.items())
        if name not in mentioned
    ]
    expanded = {
        **raw,
        "pipeline_id": pipeline.id,
        "objective": objective,
        "trainer": trainer,
        "hyperparameters": hyperparameters,
    }
    return expanded, round_row


def _round_id(raw: dict[str, Any]) -> int:
    value = raw.get("round_id")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
        raise InvalidInput.one("round_id", "must be the id of a round (a positive integer)")
    return value


def _objective_of(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {"metric": value.get("metric", "valid/error_rate"), "mode": value.get("mode", "min")}


def merged_trainer(pipeline_trainer: dict[str, Any], given: Any) -> Any:
    """The pipeline's trainer settings under the spec's own; a spec naming a workload drops the
    pipeline's command settings and the reverse. A `given` that is not an object is returned for
    `parse_spec` to refuse."""
    if given is None:
        return dict(pipeline_trainer)
    if not isinstance(given, dict):
        return given
    base = dict(pipeline_trainer)
    if "command" in given:
        base.pop("workload", None)
    if "workload" in given:
        for key in COMMAND_ONLY:
            base.pop(key, None)
    return {**base, **given}
