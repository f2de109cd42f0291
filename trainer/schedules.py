"""Learning-rate schedules as a pure function of the step: nothing to save or restore, so a resumed
run gets exactly the rates an uninterrupted one would (trainer/README.md, "Checkpoints and exact
resume").

Playbook (002), "Choosing the initial configuration": start with a constant learning rate before
adding decay schedules, so `constant` is the default. Playbook (002), FAQ "How to apply learning rate
warmup": warmup ramps the rate linearly from 0 to the base rate over `warmup_steps` and is prepended
to the decay schedule, which then runs over the remaining steps."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate(step: int, base: float, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """The rate of the update that takes the run from `step` to `step + 1` (so `step` counts the
    updates already done, 0 for the first).

    Warmup: `base * (step + 1) / warmup_steps` for the first `warmup_steps` updates (the first update
    already moves; the last warmup update uses `base`). Decay then runs over the remaining
    `total_steps - warmup_steps` updates: `linear` falls towards 0 and `cosine` follows half a cosine
    towards 0; neither spends an update at rate 0 (the last one has `base / remaining` for linear)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr_schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    remaining = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / remaining)
    if schedule == "linear":
        return base * (1.0 - progress)
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))
    return base
