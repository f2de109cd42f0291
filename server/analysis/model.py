"""Plain value types the analysis works on, separate from storage rows, and the warning shape."""

from __future__ import annotations

import contextlib
import gc
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StudyInfo:
    """A study as the analysis reads it: its row's plain fields and its stored spec."""

    id: int
    name: str
    description: str
    status: str
    spec: dict[str, Any]
    metric: str
    mode: str


@dataclass(frozen=True)
class TrialSummary:
    """One trial reduced to what the analysis needs; `objective` is its best finite value of the
    objective metric (None when it has none), `best_step` where it happened."""

    id: int
    number: int
    arm: Mapping[str, Any]
    params: Mapping[str, Any]
    status: str
    objective: float | None = None
    best_step: int | None = None
    replica_of: int | None = None
    fail_kind: str | None = None
    error: str | None = None
    # Why a completed trial with finite values is judged infeasible (divergence.py), else None.
    diverged: str | None = None
    # Why its best evaluation was set aside as a lone outlier (outliers.py; `objective` is then its
    # best genuine evaluation), else None.
    outlier: str | None = None
    outlier_step: int | None = None
    # Its last step with a finite value of the objective or a loss (None before curve statistics).
    last_step: int | None = None
    # `arm_key(arm)`: given by a builder of many summaries of a few arms (one key per arm; per
    # trial, the keys were a third of setting outliers aside at 50,000 trials), computed otherwise.
    arm_key: str = field(default="", compare=False)
    # Completed with a finite objective, and not judged diverged from its curves.
    feasible: bool = field(init=False, compare=False, repr=False)
    # Playbook, "Extracting insight": trials that diverge, get really bad (non-finite or
    # uncharacteristically high) values or fail because of the point itself. A completed trial
    # without a finite objective, or judged diverged, counts.
    infeasible: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Both set here, once (`dataclasses.replace` sets them again): every chart asks over every
        # trial, and as cached properties their first look was a quarter of the history chart at
        # 50,000 trials.
        if not self.arm_key:
            object.__setattr__(self, "arm_key", arm_key(self.arm))
        completed = self.status == "completed"
        feasible = completed and self.objective is not None and math.isfinite(self.objective) and self.diverged is None
        object.__setattr__(self, "feasible", feasible)
        object.__setattr__(self, "infeasible", self.status == "infeasible" or (completed and not feasible))


@dataclass(frozen=True)
class Curve:
    """One metric of one trial against step, in step order; NaN stands for any non-finite value."""

    steps: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, steps: Iterable[float], values: Iterable[float]) -> Curve:
        return cls(np.asarray(list(steps), dtype=float), np.asarray(list(values), dtype=float))

    def finite(self) -> Curve:
        keep = np.isfinite(self.values)
        return Curve(self.steps[keep], self.values[keep])

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class Objective:
    """The study's objective: metric name and mode. `sign` turns values into lower-is-better."""

    metric: str
    mode: str = "min"

    @property
    def sign(self) -> float:
        return 1.0 if self.mode == "min" else -1.0


def arm_key(arm: Mapping[str, Any]) -> str:
    """A stable key for an arm (its scientific values)."""
    try:
        # with each value's type: 1, 1.0 and True are equal keys of a cache but not the same arm
        return _arm_key_of(tuple((k, type(v), v) for k, v in sorted(arm.items())))
    except TypeError:  # a value that is not hashable (a list): not kept
        return json.dumps(arm, sort_keys=True, default=str)


@lru_cache(maxsize=4096)
def _arm_key_of(items: tuple[tuple[str, type, Any], ...]) -> str:
    """Kept per arm: a study has a few arms, and 50,000 trials' keys were 14 % of the judgement
    every chart starts from."""
    return json.dumps({k: v for k, _, v in items}, sort_keys=True, default=str)


def arm_label(arm: Mapping[str, Any]) -> str:
    """`optimizer=adam, depth=4`, or `all trials` for a study with a single arm."""
    return ", ".join(f"{k}={v}" for k, v in sorted(arm.items())) or "all trials"


def warning(
    kind: str, message: str, *, param: str | None = None, side: str | None = None, trial_id: int | None = None
) -> dict[str, Any]:
    """A typed warning in the API's shape `{kind, message, param, side, trial_id}`."""
    return {"kind": kind, "message": message, "param": param, "side": side, "trial_id": trial_id}


def fmt(value: Any) -> str:
    """A number for a message: 4 significant digits, integers as integers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) < 1e9):
        return str(int(value))
    return f"{value:.4g}"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a block builds many objects that form no cycles
    (reference counting still frees them): each of its full passes walks every object alive, and
    those passes grow with what is being built. It resumes unless it was off already."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
