"""Warm start: the completed and infeasible trials of earlier studies seed a bayesian study's model,
when the earlier study's space contains the new one's (the playbook's exploration, then
exploitation in a narrowed space: "After exploration concludes").

Contains means: the same objective (metric and mode), workload and max_train_steps; every name
declared in one study is declared in the other; a name the new study searches is searched there
too, over a range or values that include the new ones; a name the new study fixes is fixed there
at the same value, or is one of the values of a categorical/discrete name there. Trials whose
params fall outside the new space (a narrowed range, another fixed value) are left out; the rest
are placed in the new unit cube and observed like the study's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpo.server.bayesian import settings as bayes
from hpo.server.bayesian.queue import arm_key
from hpo.server.errors import FieldError, InvalidInput
from hpo.server.layout import quasi_random as layout
from hpo.server.models import Study, Trial, TrialStatus
from hpo.server.space.dimension import contains, to_unit, value_key
from hpo.server.space.search_space import ArmSpace
from hpo.server.spec.model import CROSSED_TYPES, Hyperparameter, StudySpec
from hpo.server.spec.parse import parse_spec

Observation = list[Any]  # [full unit point of the new study, objective value or None (infeasible)]


def warm_observations(session: Session, spec: StudySpec) -> dict[str, list[Observation]]:
    """By arm key (queue.arm_key), the warm-start observations of every listed study; raises
    `InvalidInput` naming each study whose space does not contain this one's and why."""
    settings = spec.bayesian
    if settings is None or settings.warm_start is None:
        return {}
    errors: list[FieldError] = []
    sources: list[tuple[int, StudySpec]] = []
    for index, study_id in enumerate(settings.warm_start.study_ids):
        path = f"bayesian.warm_start.study_ids[{index}]"
        study = session.get(Study, study_id)
        if study is None:
            errors.append(FieldError(path, f"names no study ({study_id})"))
            continue
        old = parse_spec(study.spec)
        found = [FieldError(path, f"study {study_id}: {reason}") for reason in mismatches(old, spec)]
        errors += found
        if not found:
            sources.append((study_id, old))
    if errors:
        raise InvalidInput(errors)
    out: dict[str, list[Observation]] = {}
    spaces = [bayes.arm_space(spec, arm) for arm in layout.arms(spec)]
    for study_id, _ in sources:
        rows = session.execute(
            select(Trial.params, Trial.status, Trial.objective_value)
            .where(Trial.study_id == study_id, Trial.status.in_([TrialStatus.completed, TrialStatus.infeasible]))
            .order_by(Trial.id)
        ).all()
        for params, status, value in rows:
            for space in spaces:
                unit = _place(spec, space, params)
                if unit is not None:
                    feasible = status is TrialStatus.completed and value is not None
                    out.setdefault(arm_key(space.arm), []).append([unit, value if feasible else None])
    return out


def mismatches(old: StudySpec, new: StudySpec) -> Iterator[str]:
    """Why `old`'s space does not contain `new`'s, one reason per difference."""
    pairs = [(f"objective.{f}", getattr(old.objective, f), getattr(new.objective, f)) for f in ("metric", "mode")]
    pairs += [
        (f"trainer.{f}", getattr(old.trainer, f), getattr(new.trainer, f)) for f in ("workload", "max_train_steps")
    ]
    for label, there, here in pairs:
        if there != here:
            yield f"{label} is {there!r} there, {here!r} here"
    names = {hp.name for hp in old.hyperparameters} | {hp.name for hp in new.hyperparameters}
    for name in sorted(names):
        theirs, ours = old.declarations(name), new.declarations(name)
        if not theirs:
            yield f"{name!r} is not declared there"
        elif not ours:
            yield f"{name!r} is declared there but not here: declare it (fixed at the value to keep)"
        else:
            for hp in ours:
                reason = _not_contained(hp, theirs)
                if reason:
                    yield f"{name!r} {reason}"


def _not_contained(hp: Hyperparameter, theirs: list[Hyperparameter]) -> str | None:
    if hp.role == "fixed" and _insensitive_inside(hp, theirs):
        return None
    if hp.role == "fixed":
        if any(t.role == "fixed" and value_key(t.value) == value_key(hp.value) for t in theirs):
            return None
        if any(t.varied and t.type in CROSSED_TYPES and contains(t.values or [], hp.value) for t in theirs):
            return None
        return f"is fixed at {hp.value!r} here, which is neither its fixed value nor one of its values there"
    varied = [t for t in theirs if t.varied and t.type == hp.type]
    if not varied:
        return f"is searched here ({hp.type}) but not there (as {hp.type})"
    if hp.type in CROSSED_TYPES:
        if any(all(contains(t.values or [], v) for v in hp.values or []) for t in varied):
            return None
        return f"values {hp.values} are not all among its values there"
    if any((t.min or 0) <= (hp.min or 0) and (hp.max or 0) <= (t.max or 0) for t in varied):
        return None
    ranges = ", ".join(f"[{t.min}, {t.max}]" for t in varied)
    return f"range [{hp.min}, {hp.max}] here is not inside {ranges} there"


def _insensitive_inside(hp: Hyperparameter, theirs: list[Hyperparameter]) -> bool:
    """A value fixed because the objective hardly depends on it (`source: "insensitive"`, the
    exploit recipe, docs/rounds.md) inside a range searched there: the earlier trials still inform
    the model, their value of it is set aside (`_place`)."""
    return hp.source == "insensitive" and any(
        t.varied and t.type in ("float", "int") and to_unit(t, hp.value) == to_unit(t, hp.value) for t in theirs
    )


def _place(spec: StudySpec, space: ArmSpace, params: dict[str, Any]) -> list[float] | None:
    """The trial's full unit point in the new study for this arm, None when its params are not a
    point of the arm (another arm's value, another fixed value, outside a narrowed range)."""
    for name, value in space.arm.items():
        if name not in params or value_key(params[name]) != value_key(value):
            return None
    for hp in spec.hyperparameters:
        fixed_here = hp.role == "fixed" and hp.source != "insensitive" and hp.holds(space.arm) and hp.name in params
        if fixed_here and value_key(params[hp.name]) != value_key(hp.value):
            return None
    point = [to_unit(hp, params.get(hp.name)) for hp in space.declarations]
    if any(u != u for u in point):  # NaN: missing or outside the new space
        return None
    return space.embed(point)
