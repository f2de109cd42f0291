"""The tuning-budget bootstrap (playbook, "How many trials are needed to get good results with
quasi-random search?", Figure 3): the best value of k trials drawn from the study, for k = 1…N.

Drawing k trials with replacement from the N the study ran, the best of them is at least as good as
the i-th best of all with probability 1 - ((N - i) / N)^k, so the bootstrap's quantiles come in
closed form: exactly what infinitely many resamples would give, in O(N) per k instead of a Monte
Carlo loop. Infeasible trials take part in the draws and never win one; when every draw was
infeasible there is no best (None)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
# The budget has flattened when doubling it from N/2 to N gains (in expectation) less than this share of
# what tuning gained from one trial to N (or less than the retrain spread, where replicas measured it).
FLAT_SHARE = 0.05
MAX_POINTS = 40


@dataclass(frozen=True)
class BudgetCurve:
    """Quantiles of the best of k draws for each k in `ks`, in the metric's own units."""

    n: int
    ks: list[int]
    quantiles: dict[float, list[float | None]]
    mean: list[float | None]
    sign: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        """Quantiles named by the percentile of the *metric's values* (`p5` is always the lower
        one): `quantiles` are taken in lower-is-better order, so in `max` mode the oriented 5% is
        the values' 95th percentile."""
        names = {0.05: "p5", 0.25: "p25", 0.5: "median", 0.75: "p75", 0.95: "p95"}
        quantiles = {
            names.get(q if self.sign > 0 else round(1.0 - q, 6), f"q{q}"): v for q, v in self.quantiles.items()
        }
        return {"n": self.n, "k": self.ks, "mean": self.mean, **quantiles}


def budget_ks(n: int, max_points: int = MAX_POINTS) -> list[int]:
    """Every k up to `max_points` trials; beyond, a geometric grid that keeps 1, N/2 and N."""
    if n <= max_points:
        return list(range(1, n + 1))
    grid = np.unique(np.round(np.geomspace(1, n, max_points - 1)).astype(int))
    return sorted({*grid.tolist(), max(n // 2, 1), n})


def best_of_k(
    values: Sequence[float | None], sign: float, ks: Sequence[int] | None = None, qs: Sequence[float] = QUANTILES
) -> BudgetCurve:
    """The exact bootstrap distribution of the best of k draws. `values` holds one objective per
    trial, None for an infeasible one; `sign` is +1 when lower is better."""
    n = len(values)
    oriented = np.sort(np.array([math.inf if v is None else sign * v for v in values], dtype=float))
    ks = list(ks) if ks is not None else budget_ks(n)
    out: dict[float, list[float | None]] = {}
    for q in qs:
        # smallest 1-based i with 1 - ((n - i) / n)^k >= q
        index = np.ceil(n - n * (1.0 - q) ** (1.0 / np.asarray(ks, dtype=float)) - 1e-9).astype(int)
        picked = oriented[np.clip(index, 1, n) - 1] if n else np.array([])
        out[q] = [None if not math.isfinite(v) else float(sign * v) for v in picked]
    mean = [None if m is None else float(sign * m) for m in _expected_best(oriented, ks)]
    return BudgetCurve(n=n, ks=ks, quantiles=out, mean=mean, sign=sign)


def _expected_best(oriented: np.ndarray, ks: Sequence[int]) -> list[float | None]:
    """E[best of k draws] from sorted lower-is-better values; an infeasible draw counts as the
    worst feasible value (it is never better than that)."""
    finite = oriented[np.isfinite(oriented)]
    if not len(finite):
        return [None for _ in ks]
    v = np.where(np.isfinite(oriented), oriented, finite.max())
    n = len(v)
    above = (n - np.arange(n + 1)) / n  # P(one draw is not among the i best), i = 0..n
    out: list[float | None] = []
    for k in ks:
        weights = above[:-1] ** k - above[1:] ** k  # P(best of k is the i-th best)
        out.append(float(np.dot(weights, v)))
    return out


# The bootstrap's verdict needs this many finished trials in an arm (below it the rule abstains and
# the analysis lists it under `skipped`).
MIN_TRIALS = 4


def flattened(curve: BudgetCurve, sign: float, noise: float | None = None) -> tuple[bool, dict[str, Any]]:
    """Whether the expected best of k trials has stopped improving between k = N/2 and k = N:
    that gain is below `FLAT_SHARE` of the gain from 1 trial to N, or below `noise` (the retrain
    spread, where replicas measured it). The expectation, unlike the median, moves smoothly with
    N. Fewer than 4 trials never count as flat. Answers the verdict and the numbers behind it."""
    n = curve.n
    if n < MIN_TRIALS or 1 not in curve.ks or (n // 2) not in curve.ks:
        return False, {"n": n}
    first, half, last = (curve.mean[curve.ks.index(k)] for k in (1, n // 2, n))
    if first is None or half is None or last is None:
        return False, {"n": n}
    gain_half, gain_total = sign * (half - last), sign * (first - last)
    flat = gain_half <= FLAT_SHARE * gain_total or (noise is not None and gain_half <= noise)
    return flat, {"n": n, "gain_last_half": gain_half, "gain_total": gain_total, "expected_best": last}
