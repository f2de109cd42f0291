"""Synthetic training curves and responses with planted answers, shared by the unit tests and the
end-to-end tests that feed them through the worker protocol."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpo.server.analysis.model import Curve

HORIZON = 2000
EVAL_STEPS = np.arange(100, HORIZON + 1, 100)  # 20 evaluations
TRAIN_STEPS = np.arange(50, HORIZON + 1, 50)  # 40 training logs


def clean(seed: int, level: float = 0.1, noise: float = 0.004) -> tuple[Curve, Curve]:
    """Validation error and training loss that converge by mid-training and stay flat."""
    rng = np.random.default_rng(seed)
    tau = HORIZON / 10
    valid = level + 0.8 * np.exp(-EVAL_STEPS / tau) + noise * rng.normal(size=EVAL_STEPS.size)
    train = 0.05 + 2.0 * np.exp(-TRAIN_STEPS / tau) * (1 + 0.03 * rng.normal(size=TRAIN_STEPS.size))
    return Curve(EVAL_STEPS, valid), Curve(TRAIN_STEPS, train)


def overfitting(seed: int, level: float = 0.1) -> tuple[Curve, Curve]:
    """Validation error best near step 800, then rising by 0.15 while the training loss falls."""
    valid, _ = clean(seed, level)
    rise = 0.15 * np.clip((EVAL_STEPS - 800) / 1200, 0, None) ** 1.2
    rng = np.random.default_rng(seed + 1)
    train = 0.01 + 2.0 * np.exp(-TRAIN_STEPS / (HORIZON / 8)) * (1 + 0.03 * rng.normal(size=TRAIN_STEPS.size))
    return Curve(EVAL_STEPS, valid.values + rise), Curve(TRAIN_STEPS, train)


def still_improving(seed: int) -> tuple[Curve, Curve]:
    rng = np.random.default_rng(seed)
    tau = HORIZON / 2.5
    valid = 0.1 + 0.8 * np.exp(-EVAL_STEPS / tau) + 0.002 * rng.normal(size=EVAL_STEPS.size)
    train = 0.05 + 2.0 * np.exp(-TRAIN_STEPS / tau)
    return Curve(EVAL_STEPS, valid), Curve(TRAIN_STEPS, train)


def noisy_late(seed: int) -> tuple[Curve, Curve]:
    valid, train = clean(seed)
    rng = np.random.default_rng(seed + 2)
    jitter = np.where(EVAL_STEPS > HORIZON / 2, 0.06 * rng.normal(size=EVAL_STEPS.size), 0.0)
    return Curve(EVAL_STEPS, valid.values + jitter), train


def saturated_early(seed: int) -> tuple[Curve, Curve]:
    rng = np.random.default_rng(seed)
    steps = np.arange(20, HORIZON + 1, 20)
    tau = HORIZON / 60
    valid = 0.1 + 0.8 * np.exp(-steps / tau) + 0.002 * rng.normal(size=steps.size)
    train = 0.05 + 2.0 * np.exp(-steps / tau)
    return Curve(steps, valid), Curve(steps, train)


def training_loss_rising(seed: int) -> tuple[Curve, Curve]:
    valid, train = clean(seed)
    rise = 0.8 * np.clip((TRAIN_STEPS - 1200) / 800, 0, None)
    return valid, Curve(TRAIN_STEPS, train.values + rise)


def response(log_lr: float, optimum: float, scale: float = 0.15) -> float:
    """A validation error with a quadratic valley in log10(learning rate) around `optimum`."""
    return 0.1 + scale * (log_lr - optimum) ** 2


def lr_of(unit: float, lo: float, hi: float) -> float:
    return math.exp(math.log(lo) + unit * (math.log(hi) - math.log(lo)))


def diverged(seed: int) -> tuple[Curve, Curve]:
    """A run that learns, then blows up with finite values (training loss to 2.5e7 from step 600)
    and sits at chance (validation error 0.9) to the end, as Nesterov runs with too high a learning
    rate do."""
    valid, train = clean(seed, 0.1)
    v = np.where(EVAL_STEPS >= 600, 0.9, valid.values)
    blown = 2.5e7 * (1 + 0.1 * np.random.default_rng(seed).random(TRAIN_STEPS.size))
    t = np.where(TRAIN_STEPS >= 600, blown, train.values)
    return Curve(EVAL_STEPS, v), Curve(TRAIN_STEPS, t)


def at_chance(seed: int) -> tuple[Curve, Curve]:
    """A run that never learns: training loss flat at ln 10, validation error at chance (0.9)."""
    rng = np.random.default_rng(seed)
    valid = 0.9 + 0.002 * rng.normal(size=EVAL_STEPS.size)
    train = math.log(10) + 0.01 * rng.normal(size=TRAIN_STEPS.size)
    return Curve(EVAL_STEPS, np.minimum(valid, 0.9)), Curve(TRAIN_STEPS, train)


def overfit_doubling(seed: int, level: float = 0.05) -> tuple[Curve, Curve]:
    """Validation error from chance down to `level` at step 600, then doubling to 2 x level by the
    end while the training loss keeps falling: a tenth of the curve's range, plainly overfitting."""
    rng = np.random.default_rng(seed)
    drop = level + (0.9 - level) * np.exp(-EVAL_STEPS / 120)
    rise = level * np.clip((EVAL_STEPS - 600) / 1400, 0, None)
    valid = drop + rise + 0.001 * rng.normal(size=EVAL_STEPS.size)
    train = 0.01 + 2.0 * np.exp(-TRAIN_STEPS / 300) * (1 + 0.03 * rng.normal(size=TRAIN_STEPS.size))
    return Curve(EVAL_STEPS, valid), Curve(TRAIN_STEPS, train)


def unstable_train(seed: int, level: float = 0.1) -> tuple[Curve, Curve]:
    """Clean validation, but a training loss that goes up for a while mid-training after a steady
    decline (the playbook's loss instability at learning rates just above the best)."""
    valid, train = clean(seed, level)
    bump = 0.6 * np.exp(-(((TRAIN_STEPS - 1100) / 200) ** 2))
    return valid, Curve(TRAIN_STEPS, train.values + bump)


def lucky_last(seed: int, level: float = 0.1) -> tuple[Curve, Curve]:
    """Converged by mid-training and flat, but the last evaluation is a little lucky (below the
    level by three noise sd), so the best step is the last one: not a reason to train longer."""
    valid, train = clean(seed, level)
    values = valid.values.copy()
    values[-1] = level - 0.012
    return Curve(EVAL_STEPS, values), train


def class_counts(steps: np.ndarray, classes: int = 10) -> dict[str, Curve]:
    """Per-class correct counts, as hpo's classification workloads report them (they tell the
    analysis how many classes there are, so what chance is)."""
    return {f"valid/correct/class_{k}": Curve(steps, np.full(steps.size, 10.0)) for k in range(classes)}


# The ways a real run goes wrong (docs/analysis.md, "Which trials count"), each a (validation error,
# training loss) pair that first learns like `clean` (training loss from 1.6 at step 50 to 0.05),
# and the false alarms beside them.


def nan_late(seed: int) -> tuple[Curve, Curve]:
    """Learns, then the training loss turns NaN from step 1200; the run still completes."""
    valid, train = clean(seed)
    return valid, Curve(TRAIN_STEPS, np.where(TRAIN_STEPS >= 1200, np.nan, train.values))


def collapse(seed: int) -> tuple[Curve, Curve]:
    """Learns to 0.1, then collapses to chance from step 1000: error 0.9, loss back at ln 10 (the
    initial value of an untrained 10-class network), with no per-class counts reported."""
    valid, train = clean(seed)
    rng = np.random.default_rng(seed + 7)
    v = np.where(EVAL_STEPS >= 1000, 0.9 - 0.01 * rng.random(EVAL_STEPS.size), valid.values)
    t = np.where(TRAIN_STEPS >= 1000, math.log(10) + 0.01 * rng.normal(size=TRAIN_STEPS.size), train.values)
    return Curve(EVAL_STEPS, v), Curve(TRAIN_STEPS, np.r_[math.log(10), t[1:]])


def slow_climb(seed: int, to: float = 4.0) -> tuple[Curve, Curve]:
    """Learns until step 600, then the training loss climbs steadily to `to` times its initial value."""
    valid, train = clean(seed)
    initial = float(train.values[0])
    climb = np.clip((TRAIN_STEPS - 600) / 1400, 0, None) * to * initial
    v = valid.values + 0.4 * np.clip((EVAL_STEPS - 600) / 1400, 0, None)
    return Curve(EVAL_STEPS, v), Curve(TRAIN_STEPS, train.values + climb)


def diverged_dip(seed: int) -> tuple[Curve, Curve]:
    """Blows up to 50x its initial value from step 800, with a short dip to 0.1 at the last two logs."""
    valid, train = clean(seed)
    t = np.where(TRAIN_STEPS >= 800, 50.0 * float(train.values[0]), train.values)
    t[-2:] = 0.1
    return Curve(EVAL_STEPS, np.where(EVAL_STEPS >= 800, 0.85, valid.values)), Curve(TRAIN_STEPS, t)


def explode_settle(seed: int) -> tuple[Curve, Curve]:
    """Explodes about 1e6-fold for steps 700-1000, then settles at the initial (chance) value."""
    valid, train = clean(seed)
    initial = float(train.values[0])
    t = np.where((TRAIN_STEPS >= 700) & (TRAIN_STEPS <= 1000), 1e6 * initial, train.values)
    t = np.where(TRAIN_STEPS > 1000, initial, t)
    return Curve(EVAL_STEPS, np.where(EVAL_STEPS >= 700, 0.9, valid.values)), Curve(TRAIN_STEPS, t)


def spike_recovers(seed: int) -> tuple[Curve, Curve]:
    """A false alarm: two logs at 100x the initial loss around step 600, then it trains well."""
    valid, train = clean(seed)
    t = train.values.copy()
    t[(TRAIN_STEPS == 600) | (TRAIN_STEPS == 650)] = 100.0 * float(train.values[0])
    return valid, Curve(TRAIN_STEPS, t)


def slow_learner(seed: int) -> tuple[Curve, Curve]:
    """A false alarm: the training loss only falls to 0.9 x its initial value (it learns, slowly);
    the error falls from 0.9 to 0.6."""
    rng = np.random.default_rng(seed)
    valid = 0.6 + 0.3 * np.exp(-EVAL_STEPS / 400) + 0.003 * rng.normal(size=EVAL_STEPS.size)
    train = 2.3 * (0.9 + 0.1 * np.exp(-TRAIN_STEPS / 400)) * (1 + 0.003 * rng.normal(size=TRAIN_STEPS.size))
    return Curve(EVAL_STEPS, valid), Curve(TRAIN_STEPS, train)


def accuracy_at_chance(seed: int) -> Curve:
    """Validation accuracy of a 10-class run at chance: 0.1 with evaluation noise of sd 0.006."""
    rng = np.random.default_rng(seed)
    return Curve(EVAL_STEPS, 0.1 + 0.006 * rng.normal(size=EVAL_STEPS.size))


def valid_loss_explodes(seed: int) -> Curve:
    """A validation loss (no training loss logged) that falls from ln 10 to 0.3, then explodes 45x
    its initial value from step 1000 to the end."""
    rng = np.random.default_rng(seed)
    loss = 0.3 + 2.0 * np.exp(-EVAL_STEPS / 200) + 0.01 * rng.normal(size=EVAL_STEPS.size)
    loss[0] = math.log(10)
    return Curve(EVAL_STEPS, np.where(EVAL_STEPS >= 1000, 45.0 * math.log(10), loss))


def glitched(seed: int, level: float = 0.1, at: int = 700) -> tuple[Curve, Curve]:
    """Clean curves with one glitched evaluation of 0.0 at step `at`."""
    valid, train = clean(seed, level)
    return Curve(EVAL_STEPS, np.where(at == EVAL_STEPS, 0.0, valid.values)), train


def run_clean_trial(db: Any, seed: int, *, complete: bool = True, extra: Sequence[Any] = ()) -> int:
    """Claims the next trial through the lease protocol, records `clean(seed)`'s curves (validation
    error rate and training loss, level 0.1 + 0.01 seed) and the `extra` points, and completes it
    (or leaves it running); answers its id."""
    from hpo.server.metrics import ingest
    from hpo.server.schemas import MetricPointIn
    from hpo.server.trials import leases

    claim = leases.claim(db, "w", 4, 0, 60)
    assert claim is not None
    valid, train = clean(seed, level=0.1 + 0.01 * seed)
    points = [
        MetricPointIn(step=int(step), name=name, value=float(value))
        for name, curve in (("valid/error_rate", valid), ("train/loss", train))
        for step, value in zip(curve.steps, curve.values, strict=True)
    ]
    ingest.record_metrics(db, claim.trial_id, claim.lease_id, [*points, *extra])
    if complete:
        leases.complete(db, claim.trial_id, claim.lease_id)
    return claim.trial_id
