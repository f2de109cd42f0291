"""What the built-in workloads accept, known to the server without importing torch.

A typo in a hyperparameter name (`weight_decy`), a categorical value the trainer does not know
(`optimizer: "nesterv"`) or an objective metric no evaluation reports would otherwise be accepted at
creation and fail every trial as `config` on the worker. For the built-in workloads
(`hpo.policy.BUILTIN_WORKLOADS`) the server refuses them with the valid names listed; for a user
workload (`package.module:Name`, or a command) it cannot know the names and says so in the
creation warnings.

The training hyperparameters every workload shares come from `hpo.trainer.config` (plain Python);
what each built-in model adds, and how many classes it reports, is copied here from
`hpo.trainer.workloads`, and tests/server/spec/test_catalogue.py keeps the copy equal to the real
registry."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hpo.command_template import has_placeholders, used_hyperparameters
from hpo.server.errors import FieldError
from hpo.server.spec.model import StudySpec
from hpo.server.spec.trainer import trainer_value
from hpo.trainer.config import OPTIMIZERS, TRAINING_HYPERPARAMETERS
from hpo.trainer.schedules import SCHEDULES

_MLP_CHOICES: dict[str, tuple[str, ...]] = {
    "activation": ("relu", "gelu", "silu", "tanh", "elu", "leaky_relu"),
    "norm": ("none", "batchnorm", "layernorm"),
}
_MLP_PARAMS = ("num_layers", "width", "activation", "dropout", "norm")
# ClassificationWorkload.metric_names() without the per-class counts.
_CLASSIFICATION_METRICS = ("loss", "error_rate", "accuracy", "examples")


@dataclass(frozen=True)
class BuiltinWorkload:
    """`model_params`: the workload's own hyperparameters; `num_classes`: the default class count
    (`num_classes_option` names the workload option that changes it, if any)."""

    model_params: tuple[str, ...]
    num_classes: int = 0
    num_classes_option: str | None = None
    # What a workload that is not a classifier reports (the metric names, fixed).
    metrics: tuple[str, ...] | None = None

    def hyperparameters(self) -> tuple[str, ...]:
        return (*TRAINING_HYPERPARAMETERS, *self.model_params)

    def metric_names(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        """The names `eval_metrics` reports (without the `valid/` prefix), as the trainer's
        ClassificationWorkload.metric_names() gives them."""
        if self.metrics is not None:
            return self.metrics
        classes = options.get(self.num_classes_option) if self.num_classes_option else None
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
            classes = self.num_classes
        return (*_CLASSIFICATION_METRICS, *(f"correct/class_{k}" for k in range(classes)))


BUILTIN: dict[str, BuiltinWorkload] = {
    "synthetic_mlp": BuiltinWorkload(_MLP_PARAMS, num_classes=10, num_classes_option="num_classes"),
    "digits": BuiltinWorkload((*_MLP_PARAMS, "input_noise"), num_classes=10),
    "char_lm": BuiltinWorkload(("embed_dim", "hidden"), metrics=("loss", "error_rate", "perplexity", "tokens")),
}

# Categorical hyperparameters whose values the trainer checks against a fixed list.
CHOICES: dict[str, tuple[str, ...]] = {"optimizer": OPTIMIZERS, "lr_schedule": SCHEDULES, **_MLP_CHOICES}


def workload_errors(spec: StudySpec) -> list[FieldError]:
    """Every hyperparameter name, categorical value and objective metric of a built-in workload's
    study that its trainer would refuse; empty for user workloads (see `workload_warnings`)."""
    workload = _builtin(spec)
    if workload is None:
        return []
    return list(_name_errors(spec, workload)) + list(_metric_errors(spec, workload))


def workload_warnings(spec: StudySpec) -> list[dict[str, Any]]:
    """Creation warnings for a user workload: its names cannot be checked before a trial runs; and
    for a command with placeholders, the varied hyperparameters none of them passes."""
    if _builtin(spec) is not None:
        return []
    return _unchecked(spec) + _unpassed(spec)


def _unpassed(spec: StudySpec) -> list[dict[str, Any]]:
    """A command that takes its hyperparameters as placeholders but names none for some that the
    study varies would train every trial at the script's default for them, silently."""
    command = trainer_value(spec, "command")
    if not command or not has_placeholders(command):
        return []
    varied = sorted({hp.name for hp in spec.hyperparameters if hp.role != "fixed"})
    missing = [name for name in varied if name not in used_hyperparameters(command, varied)]
    if not missing:
        return []
    return [
        {
            "kind": "unpassed_hyperparameter",
            "message": (
                f"trainer.command passes no placeholder for {', '.join(missing)}, which the study varies: unless "
                "the script reads them from $HPO_CONFIG, every trial trains at the script's own default for them. "
                "Add --name={name} placeholders, or {args} for all (docs/scripts.md)"
            ),
        }
    ]


def _unchecked(spec: StudySpec) -> list[dict[str, Any]]:
    command = trainer_value(spec, "command")
    what = f"command {command!r}" if command else f"workload {spec.trainer.workload!r}"
    return [
        {
            "kind": "unchecked_workload",
            "message": (
                f"The {what} is not built in, so the server cannot check its hyperparameter names or that it "
                f"reports objective.metric {spec.objective.metric!r}; a mistake there fails the first trials "
                "as 'config' and pauses the study. "
                + (
                    "Run one trial's command by hand first: the dashboard's Reproduce command on a trial does that."
                    if command
                    else "Try one config with `hpo train --config` first."
                )
            ),
        }
    ]


def _builtin(spec: StudySpec) -> BuiltinWorkload | None:
    if trainer_value(spec, "command"):
        return None
    return BUILTIN.get(spec.trainer.workload)


def _name_errors(spec: StudySpec, workload: BuiltinWorkload) -> Iterator[FieldError]:
    known = workload.hyperparameters()
    for index, hp in enumerate(spec.hyperparameters):
        path = f"hyperparameters[{index}]"
        if hp.name not in known:
            yield FieldError(
                f"{path}.name",
                f"{hp.name!r} is not a hyperparameter of workload {spec.trainer.workload!r}; known: {', '.join(known)}",
            )
            continue
        allowed = CHOICES.get(hp.name)
        if allowed is None:
            continue
        for field, values in (("values", hp.values or []), ("value", [] if hp.value is None else [hp.value])):
            bad = [v for v in values if v not in allowed]
            if bad:
                yield FieldError(
                    f"{path}.{field}", f"{hp.name} {', '.join(map(repr, bad))} is unknown; known: {', '.join(allowed)}"
                )


def _metric_errors(spec: StudySpec, workload: BuiltinWorkload) -> Iterator[FieldError]:
    options = trainer_value(spec, "workload_options")
    names = workload.metric_names(options if isinstance(options, Mapping) else {})
    reported = [f"valid/{n}" for n in names]
    train_eval = trainer_value(spec, "train_eval_examples")
    if isinstance(train_eval, int) and not isinstance(train_eval, bool) and train_eval > 0:
        reported += [f"train_eval/{n}" for n in names]
    if spec.objective.metric not in reported:
        hint = "" if train_eval else " (train_eval/... needs trainer.train_eval_examples > 0)"
        yield FieldError(
            "objective.metric",
            f"{spec.objective.metric!r} is not reported by workload {spec.trainer.workload!r}; "
            f"known: {', '.join(reported)}{hint}",
        )
