"""Placeholders in `trainer.command`: hyperparameters into a script's own argv (docs/scripts.md).

W&B Sweeps passes `${args}`, Katib `${trialParameters.lr}`; hpo's command may hold:

- `{name}`: the value of hyperparameter `name`, formatted so that argparse's `type=float` or
  `type=int` reads it back exactly (`repr` of a float, digits of an int); empty where a
  conditional hyperparameter does not apply to the trial;
- `{args}`, alone in its argument: one `--name=value` argument per hyperparameter of the trial;
- `{seed}`, `{out_dir}` (`$HPO_OUT_DIR`), `{resume_from}` (the checkpoint to resume from, empty for
  none), `{config}` (the `$HPO_CONFIG` file) and `{python}` (the Python running the worker, so a
  command need not rely on whatever `python` the worker's PATH finds);
- `{{` and `}}` for literal braces.

The operator's allow-list matches the command as written (placeholders and all), and values are
put in after, so no hyperparameter value can change which program runs. Standard library only:
the server checks templates at creation, the worker expands them, the dashboard's Reproduce
command shows them expanded."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
BUILTIN = ("seed", "out_dir", "resume_from", "config", "python")
ARGS = "{args}"


class TemplateError(ValueError):
    """A command template that cannot be expanded; `index` is the argument's position."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def placeholders(argument: str) -> list[str]:
    """The names of the placeholders in one argument (`{args}` included); raises ValueError on a
    lone brace."""
    names = []
    for match in _TOKEN.finditer(argument):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None:
            raise ValueError(f"a lone {token!r}: write {token * 2!r} for a literal brace")
        names.append(match.group(1))
    return names


def template_errors(argv: Sequence[str], hyperparameters: Iterable[str]) -> list[TemplateError]:
    """Why `argv` cannot be expanded for a study with these hyperparameter names (empty when it can)."""
    known = set(hyperparameters)
    errors = []
    for index, argument in enumerate(argv):
        try:
            names = placeholders(argument)
        except ValueError as exc:
            errors.append(TemplateError(index, str(exc)))
            continue
        if "args" in names and argument != ARGS:
            errors.append(TemplateError(index, "{args} must be an argument of its own"))
        for name in names:
            if name != "args" and name not in BUILTIN and name not in known:
                choices = ", ".join(sorted(known)) or "none"
                errors.append(
                    TemplateError(
                        index,
                        f"{{{name}}} names no hyperparameter of the study (hyperparameters: {choices}; "
                        f"also {', '.join('{' + b + '}' for b in (*BUILTIN, 'args'))})",
                    )
                )
    return errors


def has_placeholders(argv: Sequence[str]) -> bool:
    return any("{" in argument or "}" in argument for argument in argv)


def format_value(value: Any) -> str:
    """A hyperparameter as argparse reads it back exactly: floats by `repr` (shortest round trip),
    integral floats of an int-typed knob stay floats (`1.0`), booleans `True`/`False`."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def expand(
    argv: Sequence[str],
    params: Mapping[str, Any],
    builtins: Mapping[str, str],
) -> list[str]:
    """The argv to run: placeholders replaced by `params` and `builtins` (`seed`, `out_dir`,
    `resume_from`, `config`, `python`). Raises TemplateError for a name in neither (the server
    refuses such templates at creation, so this means a changed study)."""
    expanded: list[str] = []
    for index, argument in enumerate(argv):
        if argument == ARGS:
            expanded.extend(f"--{name}={format_value(params[name])}" for name in sorted(params))
            continue
        expanded.append(_TOKEN.sub(functools.partial(_value, index=index, params=params, builtins=builtins), argument))
    return expanded


def _value(match: re.Match[str], *, index: int, params: Mapping[str, Any], builtins: Mapping[str, str]) -> str:
    token = match.group(0)
    if token in ("{{", "}}"):
        return token[0]
    name = match.group(1)
    if name is None:
        raise TemplateError(index, f"a lone {token!r} in argument {index}")
    if name in builtins:
        return builtins[name]
    if name in params:
        return format_value(params[name])
    return ""  # a conditional hyperparameter that does not apply to this trial


def used_hyperparameters(argv: Sequence[str], params: Iterable[str]) -> set[str]:
    """The hyperparameters the command passes to the program (all of them with `{args}`)."""
    names = set(params)
    used: set[str] = set()
    for argument in argv:
        if argument == ARGS:
            return names
        try:
            used.update(n for n in placeholders(argument) if n in names)
        except ValueError:
            continue
    return used
