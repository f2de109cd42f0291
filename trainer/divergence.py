"""Divergence by "uncharacteristically high" training loss, not only by NaN.

Playbook (002), "Identifying unstable workloads", Figure 7a: an infeasible trial "either produces
NaNs or uncharacteristically high values of the loss". A run whose loss blows up to 2.5e7 and then
sits at chance with finite values is as infeasible as one that hits NaN; counting it as feasible
hides the instability (no hint, no red cross, and it enters the tuning-budget bootstrap).

The rule (the same one the server's analysis applies to stored curves, server/analysis/divergence.py):
a run has diverged when, for `patience` consecutive reported steps, its training loss is above both
`factor` times its initial loss and `factor` times its running minimum. Requiring both keeps a loss
that starts high and falls from tripping it, and a loss that rises a little late in training (a
mild instability, reported by the analysis instead) too; requiring a sustained stretch keeps a
single spike, or the early instability some models recover from (the playbook's note on early
instability), from ending a run. The rule applies to positive losses (cross-entropy, squared
error); a run whose initial loss is not positive is never judged.

Defaults: `factor` 3 (a 10-class cross-entropy starts at ln 10 = 2.3, so the loss must stay above
6.9, where the model is confidently wrong) and `patience` 20 steps. Both are trainer settings
(`divergence_factor`, null to turn the check off, and `divergence_patience`)."""

from __future__ import annotations

import math

DEFAULT_FACTOR = 3.0
DEFAULT_PATIENCE = 20


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


def is_high(loss: float, initial: float, minimum: float, factor: float) -> bool:
    """The rule's threshold: above `factor` times both the initial loss and the running minimum."""
    return loss > factor * initial and loss > factor * minimum
