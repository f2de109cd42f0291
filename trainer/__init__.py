"""hpo's trainer: one training run, config in, metrics and checkpoints out (trainer/README.md).

    from hpo.trainer import train
    result = train({"params": {...}, "trainer": {...}, "seed": 0}, "runs/a", reporter=None)

`train` is imported lazily, so `hpo.trainer.ConfigError` and the CLI load without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .reporters import NullReporter, Reporter
from .result import RunResult

if TYPE_CHECKING:
    from .loop import train

__all__ = ["ConfigError", "NullReporter", "Reporter", "RunResult", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from .loop import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
