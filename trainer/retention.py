"""Which checkpoints to keep (playbook 000, "Saving checkpoints and retrospectively selecting the
best checkpoint"): the same rule for the built-in trainer and for `trainer.command` scripts, whose
worker must not load torch to apply it (no torch import here)."""

from __future__ import annotations

from collections.abc import Mapping

from .config import Objective


def kept_steps(objectives: Mapping[int, float | None], keep_best: int, objective: Objective) -> set[int]:
    """The steps to keep: the `keep_best` best finite objective values (earlier step first on ties)
    and the newest step."""
    scored = [(step, value) for step, value in objectives.items() if value is not None and value == value]
    sign = 1.0 if objective.mode == "min" else -1.0
    best = sorted(scored, key=lambda item: (sign * item[1], item[0]))[:keep_best]
    kept = {step for step, _ in best}
    if objectives:
        kept.add(max(objectives))
    return kept
