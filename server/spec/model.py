"""The study spec a user POSTs (docs/spec.md): its shape, as strict pydantic models, and the
arms its crossed scientific hyperparameters make. `parse.parse_spec(raw)` is the one entry point
that turns a raw JSON value into a `StudySpec` (parse.py holds every check); a spec it accepts
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
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer

from hpo.server.numbers import INTEGRAL, Integer
from hpo.server.space.dimension import CELL_TYPES, contains

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


# --- semantic errors -----------------------------------------------------------------------------


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
