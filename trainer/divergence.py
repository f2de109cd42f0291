"""What "diverged" means: the one definition the trainer, the analysis, every chart, plot and the
CSV share (docs/analysis.md, "Which trials count": "Diverged has one definition in one function").

Playbook (002), "Identifying unstable workloads", Figure 7a: an infeasible trial "either produces
NaNs or uncharacteristically high values of the loss". A run whose loss blows up to 2.5e7 and then
sits at chance with finite values is as infeasible as one that hits NaN; counting it as feasible
hides the instability (no hint, no red cross, and it enters the tuning-budget bootstrap).

`judge` decides from a run's curves (a pure function of arrays: standard library and numpy only,
so the server imports it without the trainer's torch). A run has diverged when

1. *not finite*: its training or validation loss (or its objective) is NaN or infinite at any step;
2. *exploded*: a loss (training or validation) stays above `factor` times both its initial value
   and its running minimum for a sustained stretch (`required_run`: `patience` logged points, at
   most a tenth of the curve and at least 3), anywhere in the run, whether or not it comes back
   down to chance afterwards. A single spike, or a short instability the run recovers from, is not
   sustained: such a run stays feasible and feeds the analysis' instability hint instead (002,
   "Identifying unstable workloads": loss that "goes up not down during periods of training");
3. *no better than chance*: where chance is known for the objective (`chance_of`: the trainer
   reports per-class counts), its end level (`end_level`: the median of its last tenth) is within
   `margin` of chance, the margin
   a share of the distance from chance to a perfect score, so it means the same for error rate,
   accuracy and loss (2 % of 0.9 for a 10-class error rate, 2 % of 0.9 for accuracy too, not 2 %
   of 0.1);
4. *no better than its initial loss*: the training loss (the validation loss where no training
   loss is logged) ends within `margin` of its initial value or above it (its end level here the
   lower quartile of its last tenth, so late spikes in a quarter of the logs do not count). An untrained network's
   cross-entropy is chance (ln K), so this is "back at chance" without per-class counts: a collapse
   after learning, a slow climb to several times the initial loss, a run that never learned.

The trainer applies rule 1 and rule 2 online (`DivergenceMonitor`, same threshold `is_high` and the
same `patience`), and ends such runs `infeasible`; the monitor's reference values (the initial loss,
the running minimum, the current stretch) are part of every checkpoint, so a resumed run is judged
against the same values as its uninterrupted twin (trainer/README.md, "Checkpoints and exact
resume"); the analysis applies `judge` to every completed
trial's stored curves, so trials run by any trainer (user scripts, older runs) are judged alike.

Defaults: `factor` 3 (a 10-class cross-entropy starts at ln 10 = 2.3, so the loss must stay above
6.9, where the model is confidently wrong), `patience` 20 logged points and `margin` 0.02. All
three are trainer settings (`divergence_factor`, null to turn rule 2 off, `divergence_patience`,
`divergence_margin`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

DEFAULT_FACTOR = 3.0
DEFAULT_PATIENCE = 20
# "No better than chance / than the initial loss": within this share of the way from chance to perfect.
DEFAULT_MARGIN = 0.02
# The end level is the median of the last tenth of a curve's points, and of at least this many.
END_POINTS = 3
LOSS_QUANTILE = 0.25
TRAIN_LOSS = "train/loss"


@dataclass(frozen=True)
class Rule:
    """The thresholds of `judge` (trainer settings `divergence_factor`, `divergence_patience`,
    `divergence_margin`); `factor` None turns the explosion rule off."""

    factor: float | None = DEFAULT_FACTOR
    patience: int = DEFAULT_PATIENCE
    margin: float = DEFAULT_MARGIN

    @classmethod
    def of(cls, settings: Mapping[str, object]) -> Rule:
        """The rule a study's trainer settings ask for (the defaults where they say nothing)."""
        factor = settings.get("divergence_factor", DEFAULT_FACTOR)
        patience = settings.get("divergence_patience", DEFAULT_PATIENCE)
        margin = settings.get("divergence_margin", DEFAULT_MARGIN)
        return cls(
            None if factor is None else float(factor),  # type: ignore[arg-type]
            max(1, int(patience)),  # type: ignore[call-overload]
            float(margin),  # type: ignore[arg-type]
        )


class DivergenceMonitor:
    """Fed one training loss per step (`update`); answers a reason once the run has diverged."""

    def __init__(self, factor: float | None = DEFAULT_FACTOR, patience: int = DEFAULT_PATIENCE) -> None:
        self.factor, self.patience = factor, max(1, int(patience))
        self.initial: float | None = None
        self.minimum = math.inf
        self.run = 0  # consecutive steps above the threshold so far
        self.since: int | None = None

    def update(self, step: int, loss: float) -> str | None:
        """Records the loss of `step`; answers `"training loss diverged ..."` once it has stayed
        uncharacteristically high for `patience` steps, else None. Non-finite losses are the
        caller's (they end a run at once)."""
        if self.factor is None or not math.isfinite(loss):
            return None
        if self.initial is None:
            self.initial = loss
        self.minimum = min(self.minimum, loss)
        if self.initial <= 0 or not is_high(loss, self.initial, self.minimum, self.factor):
            self.run, self.since = 0, None
            return None
        self.run += 1
        self.since = step if self.since is None else self.since
        if self.run < self.patience:
            return None
        return (
            f"training loss diverged: {loss:.4g} for {self.run} steps since step {self.since}, over {self.factor:g}x "
            f"its initial value {self.initial:.4g} and its minimum {self.minimum:.4g}"
        )

    def state(self) -> dict[str, float | int | None]:
        """What a checkpoint keeps: the reference values `update` judges against (the thresholds
        are settings, read from the config of the run that resumes)."""
        return {"initial": self.initial, "minimum": self.minimum, "run": self.run, "since": self.since}

    def load_state(self, state: Mapping[str, object]) -> None:
        initial, since = state["initial"], state["since"]
        self.initial = None if initial is None else float(initial)  # type: ignore[arg-type]
        self.minimum = float(state["minimum"])  # type: ignore[arg-type]
        self.run = int(state["run"])  # type: ignore[call-overload]
        self.since = None if since is None else int(since)  # type: ignore[call-overload]

    def replay(self, losses: Iterable[tuple[int, float]]) -> None:
        """Feeds `(step, loss)` points logged before (in step order) as `update` was fed them: how
        a checkpoint written without the monitor's state gets it back from the run's metrics."""
        for step, loss in losses:
            self.update(step, loss)


def is_high(loss: float, initial: float, minimum: float, factor: float) -> bool:
    """The rule's threshold: above `factor` times both the initial loss and the running minimum."""
    return loss > factor * initial and loss > factor * minimum


@dataclass(frozen=True)
class Series:
    """One metric of one run against step, in step order; NaN stands for any non-finite value."""

    steps: np.ndarray
    values: np.ndarray


def is_loss(name: str) -> bool:
    """Losses are named `.../loss` (`train/loss`, `valid/loss`): positive, chance at the start."""
    return name.rsplit("/", 1)[-1] == "loss"


def chance_of(metric: str, classes: int | None) -> tuple[float, float] | None:
    """(chance, perfect) of the objective of a `classes`-way classifier, where the metric's name
    says what it measures (error rate 1 - 1/K and 0, accuracy 1/K and 1, cross-entropy ln K and
    0); None otherwise."""
    if not classes or classes < 2:
        return None
    leaf = metric.rsplit("/", 1)[-1]
    if leaf == "error_rate":
        return 1.0 - 1.0 / classes, 0.0
    if leaf == "accuracy":
        return 1.0 / classes, 1.0
    if leaf == "loss":
        return math.log(classes), 0.0
    return None


def required_run(points: int, patience: int) -> int:
    """How many consecutive logged points make a stretch "sustained": `patience`, but at most a
    tenth of the curve (a script that logs 40 points cannot show 20 high ones in a short
    instability) and at least 3. A curve logged every step is judged exactly as the trainer's
    online monitor judges it."""
    return max(3, min(int(patience), math.ceil(0.1 * points)))


def explosion(values: np.ndarray, factor: float, patience: int) -> tuple[int, int] | None:
    """(first index, length) of the first sustained stretch of `values` above `is_high`'s
    threshold (against the first finite value and the running minimum), or None."""
    finite = np.isfinite(values)
    if not finite.any():
        return None
    initial = float(values[finite][0])
    if initial <= 0:
        return None  # the rule applies to positive losses only
    minimum = np.fmin.accumulate(np.where(finite, values, np.inf))
    high = finite & (values > factor * initial) & (values > factor * minimum)
    need = required_run(int(finite.sum()), patience)
    edges = np.diff(np.concatenate(([0], high.astype(np.int8), [0])))
    starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
    long = np.nonzero(ends - starts >= need)[0]
    return (int(starts[long[0]]), int(ends[long[0]] - starts[long[0]])) if len(long) else None


def end_level(series: Series, quantile: float = 0.5) -> float:
    """A run's end level, robust to a lucky or glitched last point and to a short dip: the
    `quantile` (the median by default) of its last tenth of finite points (at least `END_POINTS`)."""
    values = series.values[np.isfinite(series.values)]
    if not len(values):
        return math.nan
    return float(np.quantile(values[-end_points(len(values)) :], quantile))


def end_points(n: int) -> int:
    """How many of a curve's last points `end_level` reads."""
    return max(END_POINTS, math.ceil(0.1 * n))


def judge(
    curves: Mapping[str, Series],
    objective: str,
    mode: str,
    *,
    chance: tuple[float, float] | None = None,
    rule: Rule = Rule(),
    train_loss: str = TRAIN_LOSS,
) -> str | None:
    """Why a run has diverged, or None (the rules of the module doc, in order). `curves` holds
    its training and validation losses and its objective by name (any may be missing);
    `chance` is the objective's (chance, perfect) where known; `train_loss` is the name the run
    reports its training loss under (a script's own, aliased to `train/loss` in a spec's
    `analysis.aliases`): that curve is judged as the training loss, whatever its name says. The
    reason starts with its kind (`training loss diverged: ...`)."""
    if train_loss != TRAIN_LOSS and train_loss in curves:
        curves = {TRAIN_LOSS if n == train_loss else n: c for n, c in curves.items() if n != TRAIN_LOSS}
    losses = sorted((n for n in curves if is_loss(n)), key=lambda n: n != TRAIN_LOSS)
    for name in [*losses, *([objective] if objective in curves and objective not in losses else [])]:
        bad = ~np.isfinite(curves[name].values)
        if bad.any():
            step, value = curves[name].steps[bad][0], curves[name].values[bad][0]
            return f"{_label(name)} not finite: {value} at step {int(step)}"
    if rule.factor is not None:
        for name in losses:
            found = explosion(curves[name].values, rule.factor, rule.patience)
            if found is not None:
                return _exploded(name, curves[name], *found, rule.factor)
    if chance is not None and objective in curves:
        reason = _at_chance(curves[objective], mode, chance, rule.margin)
        if reason is not None:
            return reason
    own = next((n for n in losses if n == TRAIN_LOSS), losses[0] if losses else None)
    return None if own is None else _no_better(own, curves[own], rule.margin)


def _label(name: str) -> str:
    return {"train/loss": "training loss", "valid/loss": "validation loss"}.get(name, name)


def _exploded(name: str, series: Series, start: int, length: int, factor: float) -> str:
    finite = series.values[np.isfinite(series.values)]
    stretch = series.values[start : start + length]
    return (
        f"{_label(name)} diverged: above {factor:g}x its initial value {finite[0]:.4g} for {length} points from step "
        f"{int(series.steps[start])} to {int(series.steps[start + length - 1])} (peak {float(np.max(stretch)):.4g})"
    )


def _at_chance(series: Series, mode: str, chance: tuple[float, float], margin: float) -> str | None:
    level, perfect = chance
    end = end_level(series)
    sign = 1.0 if mode == "min" else -1.0
    if not sign * end >= sign * level - margin * abs(perfect - level):
        return None
    return f"no better than chance: ends at {end:.4g}, chance {level:.4g}"


def _no_better(name: str, series: Series, margin: float) -> str | None:
    finite = series.values[np.isfinite(series.values)]
    # One logged value is its own start and end: it shows nothing about training (a study that
    # reports only its final validation loss), so the rule abstains.
    if len(finite) < 2 or finite[0] <= 0:
        return None
    # The lower quartile: a loss whose late logs spike now and then still ends where most logs are.
    initial, end = float(finite[0]), end_level(series, LOSS_QUANTILE)
    if not end >= (1.0 - margin) * initial:
        return None
    return f"{_label(name)} ends no better than its initial value: {end:.4g} against {initial:.4g} at the start"
