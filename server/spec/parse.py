"""Parsing a study spec: the shape checked by the model (pydantic's errors turned into the field
and the reason), then every check the shape cannot express (names, ranges, conditions, the
trainer's settings, the algorithm's and the bayesian designer's rules, the spec's size), and the
check of a manual trial's params."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ValidationError

from hpo.server.errors import FieldError, InvalidInput
from hpo.server.space.dimension import contains, outside_reason, value_key
from hpo.server.spec.model import (
    ANALYSIS_METRICS,
    ANALYSIS_PARAMS,
    CROSSED_TYPES,
    MAX_SPEC_DEPTH,
    MAX_TRIALS_PER_STUDY,
    NAME_PATTERN,
    RANGE_TYPES,
    BayesianSettings,
    Hyperparameter,
    ManualTrial,
    Objective,
    Resources,
    StudySpec,
    TrainerSettings,
    WarmStart,
    arm_count,
    crossed_hyperparameters,
    sampled_names,
)
from hpo.server.spec.trainer import depth, trainer_errors, trainer_value_of

# The model whose field names the last part of an error path (pydantic's errors to ours).
_MODELS: dict[str, type[BaseModel]] = {
    "objective": Objective,
    "hyperparameters": Hyperparameter,
    "resources": Resources,
    "trials": ManualTrial,
    "bayesian": BayesianSettings,
    "warm_start": WarmStart,
}


def parse_spec(raw: object) -> StudySpec:
    """A validated `StudySpec` from a raw JSON value (a dict as `json.loads` gives it).

    Raises `InvalidInput` whose `errors` name every refused field as a path
    (`hyperparameters[2].min`) with the reason in words (`must be > 0 for log scale`). Shape errors
    are all reported together; semantic errors are checked, and all reported, once the shape is
    right. Pure: no I/O, the same input gives the same answer."""
    if not isinstance(raw, dict):
        raise InvalidInput.one("body", "must be a JSON object (the study spec)")
    if depth(raw, MAX_SPEC_DEPTH) > MAX_SPEC_DEPTH:
        raise InvalidInput.one("body", f"nests deeper than {MAX_SPEC_DEPTH} levels")
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(_dedupe(_field_error(e) for e in exc.errors())) from None
    errors = _dedupe(_semantic_errors(spec))
    if errors:
        raise InvalidInput(errors)
    return spec


def _field_error(error: Mapping[str, Any]) -> FieldError:
    loc = tuple(error.get("loc", ()))
    return FieldError(_path(loc) or "body", _reason(error, loc))


def _path(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _reason(error: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        parents = [p for p in loc[:-1] if isinstance(p, str)]
        model = _MODELS.get(parents[-1], StudySpec) if parents else StudySpec
        return f"is not a known field (known: {', '.join(model.model_fields)})"
    message = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
    if message.startswith("Input should be"):
        message = "must be" + message[len("Input should be") :]
    return message


def _dedupe(errors: Iterable[FieldError]) -> list[FieldError]:
    return list(dict.fromkeys(errors))


def _semantic_errors(spec: StudySpec) -> Iterator[FieldError]:
    yield from _name_errors(spec.name)
    for index, hp in enumerate(spec.hyperparameters):
        yield from _declaration_errors(f"hyperparameters[{index}]", hp)
    yield from _duplicate_errors(spec)
    yield from _when_errors(spec)
    yield from _trainer_errors(spec)
    yield from _size_errors(spec)
    yield from _algorithm_errors(spec)
    yield from _alias_errors(spec)
    for index, trial in enumerate(spec.trials or []):
        yield from manual_trial_errors(spec, trial.params, f"trials[{index}].params")


def _alias_errors(spec: StudySpec) -> Iterator[FieldError]:
    """`analysis.aliases`: each value one of hpo's names; a parameter's key a hyperparameter or
    trainer setting the study defines (and hpo's name not defined beside it), a metric's key a
    metric name."""
    if spec.analysis is None:
        return
    declared = {hp.name for hp in spec.hyperparameters}
    settings = set((spec.trainer.model_dump(exclude_none=True) or {}).keys())
    for key, value in spec.analysis.aliases.items():
        path = f"analysis.aliases.{key}"
        if value in ANALYSIS_PARAMS:
            if key not in declared | settings:
                yield FieldError(path, f"{key!r} is not a hyperparameter or trainer setting of this study")
            elif value in declared | settings:
                yield FieldError(path, f"the study already defines {value!r}: an alias would hide one of the two")
        elif value in ANALYSIS_METRICS:
            if not NAME_PATTERN.fullmatch(key):
                yield FieldError(path, "a metric name may contain only letters, digits and _ . - /")
        else:
            known = ", ".join(ANALYSIS_PARAMS + ANALYSIS_METRICS)
            yield FieldError(path, f"{value!r} is not a name the analysis reads (one of {known})")
    targets = list(spec.analysis.aliases.values())
    for key, value in spec.analysis.aliases.items():
        if targets.count(value) > 1:
            yield FieldError(f"analysis.aliases.{key}", f"{value!r} is the alias of more than one name")


def _name_errors(name: str) -> Iterator[FieldError]:
    if any(unicodedata.category(c) == "Cc" for c in name):
        yield FieldError("name", "must not contain control characters (newlines, tabs, ...)")
    elif name.strip() != name or not name.strip():
        yield FieldError("name", "must not start or end with spaces")


def _declaration_errors(path: str, hp: Hyperparameter) -> Iterator[FieldError]:
    if not NAME_PATTERN.fullmatch(hp.name):
        yield FieldError(f"{path}.name", "may contain only letters, digits and _ . - /")
    if hp.name == "max_train_steps":
        # The playbook: the training budget is a fixed setting of a round of tuning, not tuned.
        yield FieldError(f"{path}.name", "max_train_steps is a training setting: set trainer.max_train_steps")
    if hp.source is not None and hp.role != "fixed":
        yield FieldError(f"{path}.source", "is only for fixed hyperparameters (where their value came from)")
    if hp.role == "fixed":
        yield from _fixed_errors(path, hp)
        return
    if hp.value is not None:
        yield FieldError(f"{path}.value", f"is only for fixed hyperparameters; a {hp.role} one takes a range or values")
    if hp.type is None:
        yield FieldError(
            f"{path}.type", f"is required for a {hp.role} hyperparameter (float, int, categorical, discrete)"
        )
    elif hp.type in RANGE_TYPES:
        yield from _range_errors(path, hp)
    else:
        yield from _values_errors(path, hp)


def _fixed_errors(path: str, hp: Hyperparameter) -> Iterator[FieldError]:
    if hp.value is None:
        yield FieldError(f"{path}.value", "is required for a fixed hyperparameter")
    for field in ("min", "max", "values"):
        if getattr(hp, field) is not None:
            yield FieldError(f"{path}.{field}", "is not used by a fixed hyperparameter: it has a value only")
    if hp.scale != "linear":
        yield FieldError(f"{path}.scale", "is not used by a fixed hyperparameter: it has a value only")
    number = isinstance(hp.value, (int, float)) and not isinstance(hp.value, bool)
    if hp.value is not None and hp.type in ("float", "discrete") and not number:
        yield FieldError(f"{path}.value", f"must be a number for a {hp.type} hyperparameter")
    if hp.value is not None and hp.type == "int" and not (number and float(hp.value).is_integer()):
        yield FieldError(f"{path}.value", "must be a whole number for an int hyperparameter")


def _range_errors(path: str, hp: Hyperparameter) -> Iterator[FieldError]:
    if hp.values is not None:
        yield FieldError(f"{path}.values", f"is not used by a {hp.type} hyperparameter: give min and max")
    for field in ("min", "max"):
        bound = getattr(hp, field)
        if bound is None:
            yield FieldError(f"{path}.{field}", f"is required for a {hp.type} hyperparameter")
        elif hp.type == "int" and not float(bound).is_integer():
            yield FieldError(f"{path}.{field}", f"must be a whole number for an int hyperparameter, not {bound}")
    if hp.type == "int" and hp.scale == "reverse_log":
        yield FieldError(f"{path}.scale", "must be linear or log for an int hyperparameter")
    if hp.min is not None and hp.max is not None:
        yield from _bound_errors(path, hp, hp.min, hp.max)


def _bound_errors(path: str, hp: Hyperparameter, low: float, high: float) -> Iterator[FieldError]:
    if low >= high:
        yield FieldError(f"{path}.min", f"must be < max ({low} >= {high}); a single value is a fixed hyperparameter")
    if hp.scale == "log" and low <= 0:
        yield FieldError(f"{path}.min", f"must be > 0 for log scale, not {low}")
    if hp.scale == "reverse_log" and high >= 1:
        # reverse_log makes 1 - value log-uniform (momentum, beta1): values must stay below 1.
        yield FieldError(f"{path}.max", f"must be < 1 for reverse_log scale (1 - value is log-uniform), not {high}")


def _values_errors(path: str, hp: Hyperparameter) -> Iterator[FieldError]:
    for field in ("min", "max"):
        if getattr(hp, field) is not None:
            yield FieldError(f"{path}.{field}", f"is not used by a {hp.type} hyperparameter: list its values")
    if hp.scale != "linear":
        yield FieldError(f"{path}.scale", f"is not used by a {hp.type} hyperparameter: it has no range")
    values = hp.values or []
    if not values:
        yield FieldError(f"{path}.values", f"must list at least one value for a {hp.type} hyperparameter")
        return
    if len({value_key(v) for v in values}) != len(values):
        yield FieldError(f"{path}.values", "must not list a value twice")
    if hp.type == "discrete":
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) != len(values):
            yield FieldError(f"{path}.values", "must all be numbers for a discrete hyperparameter")
        elif any(a >= b for a, b in zip(numbers, numbers[1:], strict=False)):
            yield FieldError(f"{path}.values", "must be strictly increasing for a discrete hyperparameter")


def _duplicate_errors(spec: StudySpec) -> Iterator[FieldError]:
    """A name may repeat only with the same role and type and `when` conditions that no arm
    satisfies together (learning_rate under Nesterov, learning_rate under Adam)."""
    for index, hp in enumerate(spec.hyperparameters):
        path = f"hyperparameters[{index}]"
        for other_index, other in enumerate(spec.hyperparameters[:index]):
            if other.name != hp.name:
                continue
            if (other.role, other.type) != (hp.role, hp.type):
                yield FieldError(path, f"declares {hp.name!r} again with another role or type than [{other_index}]")
            elif not _disjoint(other, hp):
                yield FieldError(
                    f"{path}.when",
                    f"must not overlap the when of [{other_index}]: {hp.name!r} is declared twice for some arm",
                )
            else:
                continue
            break


def _disjoint(a: Hyperparameter, b: Hyperparameter) -> bool:
    """No arm satisfies both conditions: some key they share allows no common value. (Keys in only
    one condition are free, since arms cross every value of every crossed hyperparameter.)"""
    left, right = a.when or {}, b.when or {}
    return any(not {value_key(v) for v in left[k]} & {value_key(v) for v in right[k]} for k in left.keys() & right)


def _when_errors(spec: StudySpec) -> Iterator[FieldError]:
    for index, hp in enumerate(spec.hyperparameters):
        if hp.when and hp.role == "scientific":
            yield FieldError(f"hyperparameters[{index}].when", "is not allowed on a scientific hyperparameter")
            continue
        for key, allowed in (hp.when or {}).items():
            yield from _condition_errors(spec, f"hyperparameters[{index}].when.{key}", key, allowed)


def _condition_errors(spec: StudySpec, path: str, key: str, allowed: list[Any]) -> Iterator[FieldError]:
    targets = spec.declarations(key)
    if not targets:
        yield FieldError(path, f"names no hyperparameter of this study ({key!r})")
    elif targets[0].role != "scientific":
        yield FieldError(path, f"must name a scientific hyperparameter; {key!r} is {targets[0].role}")
    elif not targets[0].crossed:
        yield FieldError(path, f"must name a categorical or discrete scientific hyperparameter; {key!r} is not crossed")
    elif not allowed:
        yield FieldError(path, "must list at least one value")
    else:
        for value in allowed:
            if not contains(targets[0].values or [], value):
                yield FieldError(path, f"lists {value!r}, which is not a value of {key!r} ({targets[0].values})")


def _trainer_errors(spec: StudySpec) -> Iterator[FieldError]:
    yield from trainer_errors(spec)
    declared = {hp.name for hp in spec.hyperparameters}
    for key in sorted((spec.trainer.model_extra or {}).keys() & declared):
        yield FieldError(f"trainer.{key}", f"is also declared as a hyperparameter; give {key!r} in one place")
    yield from _command_errors(spec.trainer)


def _command_errors(trainer: TrainerSettings) -> Iterator[FieldError]:
    """`trainer.command` runs a user's program (docs/scripts.md); `workdir` names its working
    directory relative to the root the worker's operator set, so it may not climb out of it."""
    if trainer.command is None:
        for key in ("workdir", "silence_timeout_seconds", "env"):
            if trainer_value_of(trainer, key) is not None:
                yield FieldError(f"trainer.{key}", "applies only to trainer.command")
        return
    if "workload" in trainer.model_fields_set:
        yield FieldError("trainer.workload", "give either trainer.workload or trainer.command, not both")
    if not trainer.command[0]:
        yield FieldError("trainer.command[0]", "must name the program to run")
    for index, arg in enumerate(trainer.command):
        if "\x00" in arg:
            yield FieldError(f"trainer.command[{index}]", "must not contain NUL characters")
    if trainer.workdir is not None:
        yield from _workdir_errors(trainer.workdir)


def _workdir_errors(workdir: str) -> Iterator[FieldError]:
    path = PurePosixPath(workdir)
    if any(unicodedata.category(c) == "Cc" for c in workdir) or "\\" in workdir:
        yield FieldError("trainer.workdir", "must not contain control characters or backslashes")
    elif path.is_absolute():
        yield FieldError("trainer.workdir", "must be relative to the worker's --workdir-root")
    elif ".." in path.parts:
        yield FieldError("trainer.workdir", "must not contain '..'")


def _size_errors(spec: StudySpec) -> Iterator[FieldError]:
    arms = arm_count(spec)
    if arms > MAX_TRIALS_PER_STUDY:
        yield FieldError(
            "hyperparameters", f"the scientific values cross into {arms} arms, over {MAX_TRIALS_PER_STUDY}"
        )
    elif spec.algorithm != "manual" and spec.num_trials * arms > MAX_TRIALS_PER_STUDY:
        yield FieldError(
            "num_trials",
            f"counts trials per arm: {spec.num_trials} x {arms} arms = {spec.num_trials * arms} trials, over the "
            f"limit of {MAX_TRIALS_PER_STUDY} a study",
        )


def _algorithm_errors(spec: StudySpec) -> Iterator[FieldError]:
    if spec.algorithm == "manual" and not spec.trials:
        yield FieldError("trials", "must list at least one trial for a manual study")
    if spec.algorithm != "manual" and spec.trials is not None:
        yield FieldError("trials", "is only for manual studies; add trials to others with POST .../trials")
    if spec.algorithm == "grid":
        yield from _grid_errors(spec)
    if spec.algorithm == "bayesian" or spec.bayesian is not None:
        yield from _bayesian_errors(spec)


def _bayesian_errors(spec: StudySpec) -> Iterator[FieldError]:
    """Why a spec is not a valid bayesian study (nothing when it is): scientific hyperparameters
    are crossed into arms, never searched (docs/bayesian.md), and there is something to search."""
    if spec.algorithm != "bayesian":
        yield FieldError("bayesian", f'is only for algorithm "bayesian", not {spec.algorithm!r}')
        return
    for index, hp in enumerate(spec.hyperparameters):
        if hp.role == "scientific" and hp.type in RANGE_TYPES:
            yield FieldError(
                f"hyperparameters[{index}].role",
                f"a bayesian study cannot compare values of the continuous scientific {hp.name!r}: it optimizes over "
                "what it searches; make it nuisance, or list the values to compare (type discrete) as arms",
            )
    if not sampled_names(spec):
        yield FieldError("hyperparameters", "a bayesian study needs at least one nuisance hyperparameter to optimize")
    settings = spec.bayesian
    if settings is not None and settings.initial_trials is not None and settings.initial_trials > spec.num_trials:
        yield FieldError(
            "bayesian.initial_trials", f"must be at most num_trials ({settings.initial_trials} > {spec.num_trials})"
        )


def _grid_errors(spec: StudySpec) -> Iterator[FieldError]:
    # The playbook accepts grid search in 1-2 dimensions only ("Where can I find an implementation
    # of quasi-random search?", after Bergstra & Bengio 2012).
    names = sampled_names(spec)
    if not names or len(names) > 2:
        yield FieldError(
            "algorithm",
            f"grid needs one or two varied dimensions, this space has {len(names)} ({', '.join(names) or 'none'}); "
            "use halton",
        )
        return
    fixed_size = math.prod(_grid_values_count(spec, n) or 1 for n in names)
    continuous = sum(1 for n in names if _grid_values_count(spec, n) is None)
    needed = fixed_size * 2**continuous
    if spec.num_trials < needed:
        yield FieldError("num_trials", f"must be at least {needed} for this grid (every value, two per range)")


def _grid_values_count(spec: StudySpec, name: str) -> int | None:
    """How many values a categorical/discrete grid axis has; None for a range (float, int)."""
    counts = [len(hp.values or []) for hp in spec.declarations(name) if hp.type in CROSSED_TYPES]
    return max(counts) if counts else None


def manual_arm(spec: StudySpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """The arm a manual trial's params name: its values of the crossed scientific names."""
    return {hp.name: params[hp.name] for hp in crossed_hyperparameters(spec) if hp.name in params}


def manual_trial_errors(spec: StudySpec, params: Mapping[str, Any], path: str) -> list[FieldError]:
    """Why user-listed `params` do not fit the study's space (empty when they do): every crossed
    scientific name must give one of its values, every sampled name that applies to that arm must
    give a value in its declared range, fixed names may only repeat their value, nothing else."""
    arm = manual_arm(spec, params)
    errors = list(_manual_arm_errors(spec, arm, path))
    if errors:
        return errors
    applicable = {hp.name: hp for hp in spec.hyperparameters if hp.sampled and hp.holds(arm)}
    fixed = {hp.name: hp.value for hp in spec.hyperparameters if hp.role == "fixed" and hp.holds(arm)}
    for name, value in params.items():
        reason = _manual_value_reason(spec, arm, applicable, fixed, name, value)
        if reason:
            errors.append(FieldError(f"{path}.{name}", reason))
    errors += [FieldError(f"{path}.{name}", "is required for this arm") for name in applicable if name not in params]
    return errors


def _manual_arm_errors(spec: StudySpec, arm: dict[str, Any], path: str) -> Iterator[FieldError]:
    for hp in crossed_hyperparameters(spec):
        if hp.name not in arm:
            yield FieldError(f"{path}.{hp.name}", f"is required: one of {hp.values}")
        elif not contains(hp.values or [], arm[hp.name]):
            yield FieldError(f"{path}.{hp.name}", f"must be one of {hp.values}, not {arm[hp.name]!r}")


def _manual_value_reason(
    spec: StudySpec,
    arm: dict[str, Any],
    applicable: dict[str, Hyperparameter],
    fixed: dict[str, Any],
    name: str,
    value: Any,
) -> str | None:
    if name in arm:
        return None
    if name in applicable:
        return outside_reason(applicable[name], value)
    if name in fixed:
        return None if value_key(value) == value_key(fixed[name]) else f"is fixed at {fixed[name]!r} in this study"
    if spec.declarations(name):
        return f"does not apply to the arm {arm} (see its when)"
    return "is not a hyperparameter of this study"
