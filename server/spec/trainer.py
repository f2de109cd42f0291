"""What a study may ask a worker to run, checked when the study is created.

- `trainer` takes only the keys a trainer reads: `TRAINER_KEYS` below, the one list, built from
  the trainer's own settings (hpo.trainer.config) plus the user-program keys. 10 MB of junk under
  an unknown key is refused, and so is a typo (`max_steps`) that would otherwise train nothing.
- `trainer.workload_options` is bounded in size and depth.
- `trainer.workload` and `trainer.command` must be allowed by the operator's `ExecutionPolicy`
  (hpo.policy; the worker checks the same again before any import): a 422 naming the field.

Pure functions; `parse_spec` calls `trainer_errors`, `create_study` calls `policy_errors`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpo.collector_spec import CollectorSpec
from hpo.command_template import template_errors
from hpo.policy import ExecutionPolicy
from hpo.server.errors import FieldError
from hpo.trainer.config import TRAINING_HYPERPARAMETERS
from hpo.trainer.config import TrainerSettings as _RunSettings

if TYPE_CHECKING:
    from hpo.server.spec.model import StudySpec

# `resume_from` is set by the worker from the server's own checkpoint records, never by a spec
# (it would name an arbitrary file for torch to load).
_WORKER_ONLY = frozenset({"resume_from"})
# A user program instead of a workload (docs/spec.md, "A user's program"; docs/scripts.md).
COMMAND_KEYS = ("command", "workdir", "env", "silence_timeout_seconds", "metrics")
TRAINER_KEYS: frozenset[str] = (
    (frozenset(_RunSettings.__dataclass_fields__) - _WORKER_ONLY)
    | frozenset(TRAINING_HYPERPARAMETERS)
    | frozenset(COMMAND_KEYS)
)
MAX_OPTIONS_BYTES = 64 * 1024
MAX_DEPTH = 16
MAX_COMMAND_ARGS = 256
MAX_ARG_CHARS = 4096
_ANY_ENV = ExecutionPolicy(env_globs=("*",))


def trainer_value(spec: StudySpec, key: str) -> Any:
    """A `trainer` setting whether the model declares it or it sits among the extra keys."""
    return trainer_value_of(spec.trainer, key)


def trainer_value_of(trainer: Any, key: str) -> Any:
    """The same, given the spec's `TrainerSettings`."""
    extra = trainer.model_extra or {}
    return extra[key] if key in extra else getattr(trainer, key, None)


def trainer_errors(spec: StudySpec) -> Iterator[FieldError]:
    keys = set(spec.trainer.model_fields_set) | set(spec.trainer.model_extra or {})
    for key in sorted(keys - TRAINER_KEYS):
        yield FieldError(f"trainer.{key}", f"is not a trainer setting (known: {', '.join(sorted(TRAINER_KEYS))})")
    options = trainer_value(spec, "workload_options")
    if options is not None:
        yield from _options_errors(options)
    command = trainer_value(spec, "command")
    if command is not None:
        errors = list(_command_errors(command))
        yield from errors
        if not errors:
            names = {hp.name for hp in spec.hyperparameters}
            for problem in template_errors(command, names):
                yield FieldError(f"trainer.command[{problem.index}]", str(problem))
    metrics = trainer_value(spec, "metrics")
    if metrics is not None:
        if command is None:
            yield FieldError("trainer.metrics", "applies only to trainer.command (the trainer writes its own points)")
        else:
            try:
                CollectorSpec.parse(metrics)
            except ValueError as exc:
                yield FieldError("trainer.metrics", str(exc))
    env = trainer_value(spec, "env")
    if env is not None:
        # The shape and the names no study may set, whatever the operator allows; the operator's
        # own allow-list is `policy_errors`.
        refusal = _ANY_ENV.env_refusal(env)
        if refusal is not None:
            yield FieldError(refusal.field, refusal.reason)
    workdir = trainer_value(spec, "workdir")
    if workdir is not None and (not isinstance(workdir, str) or not 0 < len(workdir) <= MAX_ARG_CHARS):
        yield FieldError("trainer.workdir", f"must be a path of 1 to {MAX_ARG_CHARS} characters")


def _options_errors(options: Any) -> Iterator[FieldError]:
    field = "trainer.workload_options"
    if not isinstance(options, dict):
        yield FieldError(field, "must be an object")
    elif depth(options) > MAX_DEPTH:
        yield FieldError(field, f"is nested deeper than {MAX_DEPTH} levels")
    elif len(json.dumps(options)) > MAX_OPTIONS_BYTES:
        yield FieldError(field, f"is larger than {MAX_OPTIONS_BYTES} bytes as JSON")


def _command_errors(command: Any) -> Iterator[FieldError]:
    field = "trainer.command"
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        yield FieldError(field, 'must be a list of strings (argv, e.g. ["python", "train.py"])')
    elif not command or len(command) > MAX_COMMAND_ARGS:
        yield FieldError(field, f"must list 1 to {MAX_COMMAND_ARGS} arguments")
    elif any(len(a) > MAX_ARG_CHARS for a in command):
        yield FieldError(field, f"arguments must be at most {MAX_ARG_CHARS} characters")


def policy_errors(spec: StudySpec, policy: ExecutionPolicy) -> list[FieldError]:
    """Why the operator's allow-list refuses what this study would run (empty when it may run)."""
    errors = []
    command = trainer_value(spec, "command")
    if isinstance(command, list) and command:
        reason = policy.command_refusal([str(a) for a in command])
        if reason:
            errors.append(FieldError("trainer.command", reason))
    reason = policy.workload_refusal(spec.trainer.workload)
    if reason:
        errors.append(FieldError("trainer.workload", reason))
    env = trainer_value(spec, "env")
    if env is not None:
        refusal = policy.env_refusal(env)
        if refusal is not None:
            errors.append(FieldError(refusal.field, refusal.reason))
    return errors


def depth(value: Any, limit: int = 10_000) -> int:
    """How deeply lists and objects nest in a JSON value (a scalar is 0); iterative, so a hostile
    value cannot exhaust the stack, and it stops counting past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
