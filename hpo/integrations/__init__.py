"""Callbacks that put a framework's training loop under hpo (docs/scripts.md, "Framework callbacks"):

- `hpo.integrations.lightning.HpoCallback`, for PyTorch Lightning (`pip install 'hpo[lightning]'`);
- `hpo.integrations.huggingface.HpoTrainerCallback`, for the Hugging Face `Trainer`
  (`pip install 'hpo[huggingface]'`).

Each reports the metrics the framework logs under the names the analysis reads (`valid/loss`,
`train/loss`, ...), writes the checkpoints the worker records (`$HPO_OUT_DIR/checkpoints/step-<N>`),
gives the checkpoint to resume from, answers SIGTERM with a checkpoint and a stop, and can end a
run whose loss is no longer finite as infeasible. They write through `hpo.session()`, so a script
may use both. This package imports no framework: only the module of the one you use does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__: list[str] = []

# A name the user maps to None is left out.
NameMap = Mapping[str, "str | None"]


def hpo_name(name: str, names: NameMap, default: Callable[[str], str | None]) -> str | None:
    """The hpo metric name of a framework's `name`: the user's map first, then the framework's
    default rule; None leaves the metric out."""
    if name in names:
        return names[name]
    return default(name)


def scalar(value: Any) -> float | None:
    """A logged value as a float (a Python number or a one-element tensor), or None when it is
    not a single number (a logged string, a vector)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1:
        return float(value.item())
    return None


def not_finite(values: Mapping[str, float], watched: tuple[str, ...]) -> str | None:
    """The first of the `watched` hpo names whose value is NaN or infinite, or None."""
    for name in watched:
        value = values.get(name)
        if value is not None and not math.isfinite(value):
            return name
    return None
