"""The study spec a user POSTs (docs/spec.md): its shape, and the checks that refuse a
spec with every offending field named and the reason in words.

`parse_spec(raw)` is the one entry point. It raises `InvalidInput` listing every error found: first
the shape errors (types, unknown fields, bounds), then, once the shape is right, every semantic
error (ranges, scales, conditions, duplicates, algorithm limits, manual trials). A spec it accepts
dumps with `model_dump(mode="json")` to a JSON object that `parse_spec` accepts again unchanged.

Vocabulary follows the playbook ("Identifying scientific, nuisance, and fixed hyperparameters"):
*scientific* hyperparameters are what the study measures, *nuisance* ones are optimized over for a
fair comparison, *fixed* ones are held (a caveat on the conclusions). Categorical and discrete
scientific hyperparameters are *crossed*: every combination of their values is an *arm*.

Decisions where the brief left a choice:
- A non-manual study may have no varied hyperparameter at all (only arms and fixed values):
  `num_trials` then counts repeats per arm, each with its own training seed, which measures the
  trial variance the playbook asks for ("Determining whether to adopt a training pipeline change").
  A grid, though, needs one or two varied dimensions: with none it would have a single point.
- The same name with different roles or types is refused, even under disjoint `when`.
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_serializer

from hpo.server.errors import FieldError, InvalidInput
from hpo.server.numbers import INTEGRAL, Integer
from hpo.server.space.dimension import CELL_TYPES, contains, outside_reason, value_key
from hpo.server.spec.trainer import depth, trainer_errors, trainer_value_of

MAX_TRIALS_PER_STUDY = 100_000
MAX_SPEC_DEPTH = 32
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-/]+")
# Categorical and discrete scientific values are crossed into arms: the listed types, whose values
# are cells of the unit interval.
CROSSED_TYPES = CELL_TYPES
RANGE_TYPES = ("float", "int")


def _scalar(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if not isinstance(value, (str, int, float)):  # bool is an int
        raise ValueError("must be a string, a number or a boolean")
    return value


# One clear error for a value of the wrong kind, instead of one per member of a union.
Scalar = Annotated[Any, AfterValidator(_scalar)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict: "5" is not a number and true is not an integer.
    model_config = ConfigDict(extra="forbid", strict=True)


class Objective(_Strict):
    metric: str = Field(default="valid/error_rate", min_length=1, max_length=200)
    mode: Literal["min", "max"] = "min"


class Hyperparameter(_Strict):
    """One declaration. A name may be declared several times with disjoint `when` conditions:
    the playbook's point that `learning_rate` under Nesterov and under Adam are different
    hyperparameters ("Identifying scientific, nuisance, and fixed hyperparameters")."""

    name: str = Field(min_length=1, max_length=100)
    role: Literal["scientific", "nuisance", "fixed"]
    type: Literal["float", "int", "categorical", "discrete"] | None = None
    min: Finite | None = None
    max: Finite | None = None
    scale: Literal["linear", "log", "reverse_log"] = "linear"
    values: list[Scalar] | None = Field(default=None, max_length=10_000)
    value: Scalar | None = None
    when: dict[str, list[Scalar]] | None = None
    # Why a fixed value is what it is (docs/rounds.md): "baseline", taken from the pipeline's
    # baseline; "insensitive", the exploit recipe fixed it because the objective hardly depends on it.
    source: Literal["baseline", "insensitive"] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("source", 0) is None:
            del data["source"]  # specs from before rounds dump as they did
        return data

    @property
    def varied(self) -> bool:
        """Takes more than one value in the study (scientific or nuisance)."""
        return self.role != "fixed"

    @property
    def crossed(self) -> bool:
        """Scientific categorical/discrete values are crossed into arms, not sampled."""
        return self.role == "scientific" and self.type in CROSSED_TYPES

    @property
    def sampled(self) -> bool:
        """Gets a search dimension: nuisance ones and continuous scientific ones."""
        return self.varied and not self.crossed

    def holds(self, arm: Mapping[str, Any]) -> bool:
        """Whether this declaration applies to an arm (every `when` key must match)."""
        return all(key in arm and contains(allowed, arm[key]) for key, allowed in (self.when or {}).items())


class TrainerSettings(BaseModel):
    """Fixed training settings of the study; other keys the trainer reads pass through to it
    (hpo.server.spec.trainer.TRAINER_KEYS lists them; any other key is refused).
    `max_train_steps` is never a tuned hyperparameter (playbook, "Determining the number of steps
    for each training run")."""

    model_config = ConfigDict(extra="allow", strict=True)

    workload: str = Field(default="synthetic_mlp", min_length=1, max_length=200)
    max_train_steps: Integer = Field(default=1000, ge=1, le=10**9)
    eval_every_steps: Integer = Field(default=100, ge=1, le=10**9)
    keep_best_checkpoints: Integer = Field(default=3, ge=1, le=1000)
    # A user's program instead of a workload (docs/scripts.md); exactly one of the two is meaningful.
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(default=None, min_length=1, max_length=256)
    workdir: str | None = Field(default=None, min_length=1, max_length=1000)
    silence_timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        # A command study stores no workload, so its dump parses again unchanged; a workload study
        # stores none of the command's settings.
        data = handler(self)
        if isinstance(data, dict):
            if self.command is not None:
                data.pop("workload", None)
            for key in ("command", "workdir", "silence_timeout_seconds"):
                if data.get(key, 0) is None:
                    del data[key]
        return data


class Resources(_Strict):
    workers: Integer = Field(default=1, ge=1, le=4096)
    cpus_per_worker: float = Field(default=1.0, gt=0, le=1024)
    gpus_per_worker: float = Field(default=0.0, ge=0, le=64)
    # Per process of the trial, within the worker's own maximum (docs/security.md, "Bounded
    # resources"): processes and threads it may run at once, and memory.
    max_processes: Integer | None = Field(default=None, ge=1, le=1 << 20)
    memory_gb: float | None = Field(default=None, gt=0, le=65536)


class WarmStart(_Strict):
    study_ids: list[Annotated[int, Field(ge=1, lt=2**31), INTEGRAL]] = Field(min_length=1, max_length=20)


class BayesianSettings(_Strict):
    """Options of `algorithm: "bayesian"` (docs/bayesian.md; checked in hpo.server.bayesian.settings)."""

    initial_trials: Integer | None = Field(default=None, ge=0, le=MAX_TRIALS_PER_STUDY)
    queue_size: Integer = Field(default=2, ge=1, le=256)
    warm_start: WarmStart | None = None


class ManualTrial(_Strict):
    params: dict[str, Any]
    seed: Annotated[int, Field(ge=0, lt=2**31), INTEGRAL] | None = None


# The names the analysis reads (docs/analysis.md, "Aliases"): a spec's `analysis.aliases` maps a
# script's own names onto these.
ANALYSIS_PARAMS = (
    "learning_rate",
    "warmup_steps",
    "warmup_fraction",
    "grad_clip_norm",
    "weight_decay",
    "dropout",
    "label_smoothing",
)
# train/learning_rate is read by the dashboard only (the trial page's learning-rate curve).
ANALYSIS_METRICS = ("train/loss", "train/grad_norm", "train/learning_rate")


class AnalysisSettings(_Strict):
    """How the analysis reads the study: `aliases` maps the script's names (a hyperparameter or
    trainer setting of the study, or a metric it reports) onto hpo's (`ANALYSIS_PARAMS`,
    `ANALYSIS_METRICS`)."""

    aliases: dict[Annotated[str, Field(min_length=1, max_length=200)], str] = Field(
        default_factory=dict, max_length=100
    )


class StudySpec(_Strict):
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=100_000)
    goal: str = Field(default="", max_length=100_000)
    objective: Objective = Field(default_factory=Objective)
    algorithm: Literal["halton", "random", "grid", "manual", "bayesian"] = "halton"
    num_trials: Integer = Field(default=1, ge=1, le=MAX_TRIALS_PER_STUDY)
    seed: Integer = Field(default=0, ge=0, lt=2**32)
    hyperparameters: list[Hyperparameter] = Field(default_factory=list, max_length=1000)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    resources: Resources = Field(default_factory=Resources)
    max_attempts: Integer = Field(default=3, ge=1, le=100)
    max_failed_trials: Integer = Field(default=3, ge=1, le=100_000)
    trials: list[ManualTrial] | None = Field(default=None, max_length=MAX_TRIALS_PER_STUDY)
    bayesian: BayesianSettings | None = None
    # The round the study belongs to (docs/rounds.md): what the spec leaves out comes from the
    # pipeline's baseline. `pipeline_id`, when given, must be the round's pipeline.
    round_id: Annotated[int, Field(ge=1, lt=2**31), INTEGRAL] | None = None
    pipeline_id: Annotated[int, Field(ge=1, lt=2**31), INTEGRAL] | None = None
    analysis: AnalysisSettings | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in ("round_id", "pipeline_id", "analysis"):
                if data.get(key, 0) is None:
                    del data[key]  # specs outside rounds dump as they did
        return data

    def declarations(self, name: str) -> list[Hyperparameter]:
        """Every declaration of `name`, in spec order."""
        return [hp for hp in self.hyperparameters if hp.name == name]


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


# --- shape errors: pydantic's to ours ------------------------------------------------------------

_MODELS: dict[str, type[BaseModel]] = {
    "objective": Objective,
    "hyperparameters": Hyperparameter,
    "resources": Resources,
    "trials": ManualTrial,
    "bayesian": BayesianSettings,
    "warm_start": WarmStart,
}


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


# --- semantic errors -----------------------------------------------------------------------------


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


def arm_count(spec: StudySpec) -> int:
    """How many arms the crossed scientific values make (1 when there is none)."""
    return math.prod(len(hp.values or []) or 1 for hp in crossed_hyperparameters(spec))


def crossed_hyperparameters(spec: StudySpec) -> list[Hyperparameter]:
    """The first declaration of each crossed name, in spec order."""
    seen: dict[str, Hyperparameter] = {}
    for hp in spec.hyperparameters:
        if hp.crossed:
            seen.setdefault(hp.name, hp)
    return list(seen.values())


def crossed_arms(spec: StudySpec) -> list[dict[str, Any]]:
    """Every combination of the crossed scientific values, first name slowest, in spec order;
    `[{}]` when nothing is crossed."""
    crossed = crossed_hyperparameters(spec)
    names = [hp.name for hp in crossed]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(hp.values or [] for hp in crossed))]


def sampled_names(spec: StudySpec) -> list[str]:
    """Each distinct varied name that gets a search dimension, ordered by name."""
    return sorted({hp.name for hp in spec.hyperparameters if hp.sampled})


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


# --- manual trials -------------------------------------------------------------------------------


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
