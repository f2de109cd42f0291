"""The run config: parsed and checked into frozen values before anything is built (no torch import).

`train()` takes the object a claimed trial carries and `hpo train --config` reads
(trainer/README.md; docs/worker-protocol.md, "1. Claim"):

    {"params": {...resolved hyperparameters...}, "trainer": {...settings...}, "seed": 0,
     "objective": {"metric": "valid/error_rate", "mode": "min"},
     "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0}}

Hyperparameters use the playbook's names (002, FAQ "What are the update rules for all the popular
optimization algorithms?"): `learning_rate`, `momentum`, `beta1`, `beta2`, `epsilon`,
`weight_decay`. The workload adds its own model hyperparameters (`num_layers`, `width`, ...), checked
against the workload in `hpo.trainer.workloads.resolve_model_params`. A name that neither knows is a
`ConfigError`, never silently ignored: a typo in a study would otherwise tune nothing.

A hyperparameter name may also sit in `trainer` (for example `warmup_steps` as a fixed study
setting): there it is a default that `params` overrides. Playbook (004), "Config files instead of
argument parsing": every setting lives in this one object, which the checkpoint stores resolved."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .divergence import DEFAULT_FACTOR, DEFAULT_MARGIN, DEFAULT_PATIENCE
from .errors import ConfigError
from .schedules import SCHEDULES

# Which hyperparameters each optimizer reads (playbook 002, "What are the update rules ...").
# RMSProp's squared-gradient decay (the playbook's rho) is `beta2`, as Adam's second-moment decay.
OPTIMIZER_HYPERPARAMETERS: dict[str, tuple[str, ...]] = {
    "sgd": ("learning_rate", "weight_decay"),
    "momentum": ("learning_rate", "momentum", "weight_decay"),
    "nesterov": ("learning_rate", "momentum", "weight_decay"),
    "adam": ("learning_rate", "beta1", "beta2", "epsilon", "weight_decay"),
    "adamw": ("learning_rate", "beta1", "beta2", "epsilon", "weight_decay"),
    "nadam": ("learning_rate", "beta1", "beta2", "epsilon", "weight_decay"),
    "rmsprop": ("learning_rate", "momentum", "beta2", "epsilon", "weight_decay"),
}
OPTIMIZERS = tuple(OPTIMIZER_HYPERPARAMETERS)
OBJECTIVE_MODES = ("min", "max")


@dataclass(frozen=True)
class Hyperparameters:
    """The training hyperparameters every workload shares, with their defaults."""

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    batch_size: int = 128
    label_smoothing: float = 0.0
    grad_clip_norm: float | None = None


TRAINING_HYPERPARAMETERS: tuple[str, ...] = tuple(Hyperparameters.__dataclass_fields__)


@dataclass(frozen=True)
class TrainerSettings:
    """Fixed settings of a run (a study's `trainer` block). See trainer/README.md for each one."""

    workload: str = "synthetic_mlp"
    workload_options: dict[str, Any] = field(default_factory=dict)
    max_train_steps: int = 1000
    eval_every_steps: int = 100
    checkpoint_every_steps: int | None = None
    keep_best_checkpoints: int = 3
    eval_batch_size: int | None = None
    log_every_steps: int = 10
    sanity_checks: bool = True
    overfit_one_batch: bool = False
    ghost_batch_size: int | None = None
    train_eval_examples: int = 0
    resume_from: str | None = None
    collective_timeout_s: float = 300.0
    chance_loss_tolerance: float = 0.5
    # Divergence by sustained, uncharacteristically high training loss (trainer/divergence.py).
    divergence_factor: float | None = DEFAULT_FACTOR
    divergence_patience: int = DEFAULT_PATIENCE
    # "No better than chance / than the initial loss" margin of the analysis' divergence rule.
    divergence_margin: float = DEFAULT_MARGIN
    # "epochs": the script's budget is per epoch, so trials end at different steps by design (the
    # analysis then does not flag trials that stop before max_train_steps); "steps" otherwise.
    budget_unit: str = "steps"
    precision: str = "fp32"
    grad_accumulation_steps: int = 1
    # DataLoader worker processes per rank, for workloads whose datasets are `ExampleDataset`s (trainer/batches.py).
    data_workers: int = 0

    @property
    def checkpoint_every(self) -> int:
        return self.checkpoint_every_steps or self.eval_every_steps


@dataclass(frozen=True)
class Objective:
    """The metric that picks the best checkpoints, and whether lower or higher is better."""

    metric: str = "valid/error_rate"
    mode: str = "min"

    def better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than


@dataclass(frozen=True)
class Resources:
    """One trial's processes; the trainer reads `cpus_per_worker` (torch threads) and
    `gpus_per_worker` (CUDA when > 0). The process count itself comes from WORLD_SIZE."""

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_worker))


@dataclass(frozen=True)
class RunConfig:
    """A parsed config. `model_params` are the workload's hyperparameters, resolved with their
    defaults once the workload is known (`with_model_params`)."""

    hparams: Hyperparameters
    trainer: TrainerSettings
    seed: int
    objective: Objective
    resources: Resources
    model_params: dict[str, Any] = field(default_factory=dict)

    def with_model_params(self, model_params: dict[str, Any]) -> RunConfig:
        return replace(self, model_params=dict(model_params))

    def resolved(self) -> dict[str, Any]:
        """The resolved config as plain JSON: every hyperparameter with its default filled in.
        Saved in every checkpoint (trainer/README.md, "Checkpoints and exact resume")."""
        return {
            "params": {**asdict(self.hparams), **self.model_params},
            "trainer": asdict(self.trainer),
            "seed": self.seed,
            "objective": asdict(self.objective),
            "resources": asdict(self.resources),
        }

    @property
    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed by this config."""
        resolved = self.resolved()
        return {"params": resolved["params"], "seed": self.seed, "workload": self.trainer.workload}


def parse_config(config: Mapping[str, Any]) -> RunConfig:
    """Checks and parses a config; raises `ConfigError` naming the field and the reason.
    Model hyperparameters are kept raw in `model_params` until the workload resolves them."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be an object, got {type(config).__name__}")
    params = _mapping(config.get("params"), "params")
    trainer_raw = dict(_mapping(config.get("trainer"), "trainer"))
    defaults = {k: trainer_raw.pop(k) for k in list(trainer_raw) if k in TRAINING_HYPERPARAMETERS}
    merged = {**defaults, **params}
    training = {k: v for k, v in merged.items() if k in TRAINING_HYPERPARAMETERS}
    return RunConfig(
        hparams=parse_hyperparameters(training),
        trainer=parse_trainer(trainer_raw),
        seed=_integer("seed", config.get("seed", 0), minimum=0),
        objective=parse_objective(_mapping(config.get("objective"), "objective")),
        resources=parse_resources(_mapping(config.get("resources"), "resources")),
        model_params={k: v for k, v in merged.items() if k not in TRAINING_HYPERPARAMETERS},
    )


def parse_hyperparameters(raw: Mapping[str, Any]) -> Hyperparameters:
    h = Hyperparameters()
    optimizer = _choice("params.optimizer", raw.get("optimizer", h.optimizer), OPTIMIZERS)
    clip = raw.get("grad_clip_norm")
    return Hyperparameters(
        optimizer=optimizer,
        learning_rate=_real("params.learning_rate", raw.get("learning_rate", h.learning_rate), above=0.0),
        momentum=_unit("params.momentum", raw.get("momentum", h.momentum)),
        beta1=_unit("params.beta1", raw.get("beta1", h.beta1)),
        beta2=_unit("params.beta2", raw.get("beta2", h.beta2)),
        epsilon=_real("params.epsilon", raw.get("epsilon", h.epsilon), above=0.0),
        weight_decay=_real("params.weight_decay", raw.get("weight_decay", h.weight_decay), minimum=0.0),
        lr_schedule=_choice("params.lr_schedule", raw.get("lr_schedule", h.lr_schedule), SCHEDULES),
        warmup_steps=_integer("params.warmup_steps", raw.get("warmup_steps", h.warmup_steps), minimum=0),
        batch_size=_integer("params.batch_size", raw.get("batch_size", h.batch_size), minimum=1),
        label_smoothing=_unit("params.label_smoothing", raw.get("label_smoothing", h.label_smoothing)),
        grad_clip_norm=None if clip is None else _real("params.grad_clip_norm", clip, above=0.0),
    )


# `precision`: autocast of the forward pass and the loss; fp16 also scales the loss (GradScaler).
PRECISIONS = ("fp32", "bf16", "fp16")


def parse_trainer(raw: Mapping[str, Any]) -> TrainerSettings:
    known = TrainerSettings.__dataclass_fields__
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown trainer setting(s) {', '.join(unknown)}; known: {', '.join(known)} "
            f"and the hyperparameters {', '.join(TRAINING_HYPERPARAMETERS)}"
        )
    d = TrainerSettings()
    settings = TrainerSettings(
        workload=_text("trainer.workload", raw.get("workload", d.workload)),
        workload_options=dict(_mapping(raw.get("workload_options"), "trainer.workload_options")),
        max_train_steps=_integer("trainer.max_train_steps", raw.get("max_train_steps", d.max_train_steps), minimum=1),
        eval_every_steps=_integer(
            "trainer.eval_every_steps", raw.get("eval_every_steps", d.eval_every_steps), minimum=1
        ),
        checkpoint_every_steps=_optional_int(raw, "checkpoint_every_steps", minimum=1),
        keep_best_checkpoints=_integer(
            "trainer.keep_best_checkpoints", raw.get("keep_best_checkpoints", d.keep_best_checkpoints), minimum=1
        ),
        eval_batch_size=_optional_int(raw, "eval_batch_size", minimum=1),
        log_every_steps=_integer("trainer.log_every_steps", raw.get("log_every_steps", d.log_every_steps), minimum=1),
        sanity_checks=_boolean("trainer.sanity_checks", raw.get("sanity_checks", d.sanity_checks)),
        overfit_one_batch=_boolean("trainer.overfit_one_batch", raw.get("overfit_one_batch", d.overfit_one_batch)),
        ghost_batch_size=_optional_int(raw, "ghost_batch_size", minimum=1),
        train_eval_examples=_integer("trainer.train_eval_examples", raw.get("train_eval_examples", 0), minimum=0),
        resume_from=None if raw.get("resume_from") is None else _text("trainer.resume_from", raw["resume_from"]),
        collective_timeout_s=_real("trainer.collective_timeout_s", raw.get("collective_timeout_s", 300.0), above=0.0),
        chance_loss_tolerance=_real("trainer.chance_loss_tolerance", raw.get("chance_loss_tolerance", 0.5), above=0.0),
        divergence_factor=(
            None
            if raw.get("divergence_factor", d.divergence_factor) is None
            else _real("trainer.divergence_factor", raw.get("divergence_factor", d.divergence_factor), above=1.0)
        ),
        divergence_patience=_integer(
            "trainer.divergence_patience", raw.get("divergence_patience", d.divergence_patience), minimum=1
        ),
        divergence_margin=_real(
            "trainer.divergence_margin", raw.get("divergence_margin", d.divergence_margin), above=0.0
        ),
        budget_unit=_choice("trainer.budget_unit", raw.get("budget_unit", d.budget_unit), ("steps", "epochs")),
        precision=_choice("trainer.precision", raw.get("precision", d.precision), PRECISIONS),
        grad_accumulation_steps=_integer(
            "trainer.grad_accumulation_steps", raw.get("grad_accumulation_steps", 1), minimum=1
        ),
        data_workers=_integer("trainer.data_workers", raw.get("data_workers", d.data_workers), minimum=0),
    )
    return settings


def parse_objective(raw: Mapping[str, Any]) -> Objective:
    unknown = sorted(set(raw) - {"metric", "mode"})
    if unknown:
        raise ConfigError(f"unknown objective field(s) {', '.join(unknown)}; known: metric, mode")
    return Objective(
        metric=_text("objective.metric", raw.get("metric", "valid/error_rate")),
        mode=_choice("objective.mode", raw.get("mode", "min"), OBJECTIVE_MODES),
    )


def parse_resources(raw: Mapping[str, Any]) -> Resources:
    return Resources(
        workers=_integer("resources.workers", raw.get("workers", 1), minimum=1),
        cpus_per_worker=_real("resources.cpus_per_worker", raw.get("cpus_per_worker", 1.0), above=0.0),
        gpus_per_worker=_real("resources.gpus_per_worker", raw.get("gpus_per_worker", 0.0), minimum=0.0),
    )


def check_world_size(config: RunConfig, world_size: int) -> None:
    """Settings that depend on the process count. The global batch stays fixed as the world size
    changes, so a run does not depend on it (trainer/README.md, "Hyperparameters (`params`)"): each
    rank takes `batch_size / world_size` examples."""
    batch = config.hparams.batch_size
    if batch % world_size:
        raise ConfigError(f"params.batch_size={batch} is not divisible by the world size {world_size}")
    eval_batch = config.trainer.eval_batch_size
    if eval_batch is not None and eval_batch < batch:
        # Playbook (000), "Setting up periodic evaluations": the eval batch is at least the training batch.
        raise ConfigError(f"trainer.eval_batch_size={eval_batch} must be at least params.batch_size={batch}")
    micro = config.trainer.grad_accumulation_steps
    if (batch // world_size) % micro:
        raise ConfigError(
            f"trainer.grad_accumulation_steps={micro} must divide the per-process batch {batch // world_size} "
            f"(batch_size {batch} over {world_size} processes)"
        )
    ghost = config.trainer.ghost_batch_size
    if ghost is not None and (batch // world_size) % ghost:
        raise ConfigError(
            f"trainer.ghost_batch_size={ghost} must divide the per-process batch {batch // world_size} "
            f"(batch_size {batch} over {world_size} processes)"
        )


# -- field checks ----------------------------------------------------------------------------------


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be an object, got {type(value).__name__}")
    return value


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; known: {', '.join(allowed)}")
    return str(value)


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def _real(name: str, value: Any, *, above: float | None = None, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if above is not None and not value > above:
        raise ConfigError(f"{name} must be > {above}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")
    return float(value)


def _unit(name: str, value: Any) -> float:
    """A value in [0, 1): momentum, betas, label smoothing."""
    number = _real(name, value, minimum=0.0)
    if number >= 1.0:
        raise ConfigError(f"{name} must be < 1, got {value!r}")
    return number


def _integer(name: str, value: Any, *, minimum: int | None = None) -> int:
    # Integral floats (128.0) are accepted: JSON and some samplers do not keep the int type.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _optional_int(raw: Mapping[str, Any], key: str, *, minimum: int) -> int | None:
    value = raw.get(key)
    return None if value is None else _integer(f"trainer.{key}", value, minimum=minimum)
