"""Detection and false-alarm rates of the overfitting screen, the divergence rule on stored curves
and the arm comparison, simulated with the analysis' own functions; printed as tables for
docs/analysis.md.

- Overfitting screen (curves.overfitting_screen): validation error falls from chance (0.9) to
  0.05 by step 600 of 2,000, then rises by `rise` (relative to 0.05) to the end; Gaussian noise of
  sd 0.002 per evaluation; 20 or 200 evaluations. Rise 0 is the false-alarm case.
- Divergence (divergence.judge): training loss from ln 10 down to 0.1, then from a random step in
  the run either blown up to 1e3-1e7 (detection) or a mild late rise to 1.5x its initial value, or
  a clean curve with 30% spikes (false alarms).
- Arm comparison (arms.comparison): two arms whose replica values differ by `gap` trial-variance
  sds, n replicas each; rate of the verdict `different`. Gap 0 is the false-alarm case.

The curve statistics are computed as the SQL in queries.curve_stats computes them (the late
quarter of the horizon, a least-squares line through it).

    .venv/bin/python bench/analysis_power.py [--studies 2000]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from hpo.server.analysis.arms import arm_summaries, comparison
from hpo.server.analysis.curves import overfitting_screen
from hpo.server.analysis.divergence import judge
from hpo.server.analysis.model import Curve, TrialSummary
from hpo.server.analysis.queries import CurveStats

HORIZON = 2000


def stats(curves: list[tuple[np.ndarray, np.ndarray]], first_step: int) -> CurveStats:
    """What queries.curve_stats answers for these (steps, values) curves, trial ids 1..n."""
    cut = int(0.75 * HORIZON)
    rows = []
    for steps, values in curves:
        late = steps >= cut
        x, y = (steps[late] - cut).astype(float), values[late]
        k = max(len(x), 1)
        mx, my = x.sum() / k, y.sum() / k
        vxx = max((x * x).sum() / k - mx**2, 0.0)
        cxy = (x * y).sum() / k - mx * my
        slope = cxy / vxx if vxx > 0 else 0.0
        resid = max((y * y).sum() / k - my**2 - slope * cxy, 0.0) * k / max(k - 2, 1)
        width = max(steps.max() - cut, 0)
        first = values[steps == first_step]
        rows.append(
            (
                len(steps),
                first[0] if len(first) else np.nan,
                values.min(),
                values.max(),
                my + slope * (width - mx),
                late.sum(),
                y.min() if len(y) else np.nan,
                y.max() if len(y) else np.nan,
                math.sqrt(resid),
                slope * width,
            )
        )
    a = np.array(rows, dtype=float)
    return CurveStats(np.arange(1, len(curves) + 1), *(a[:, i] for i in range(10)))


def overfit_rate(rise: float, evals: int, studies: int, rng: np.random.Generator) -> float:
    steps = np.linspace(HORIZON / evals, HORIZON, evals).astype(int)
    curves, trials = [], []
    for i in range(studies):
        clean = 0.05 + 0.85 * np.exp(-steps / 120)
        valid = clean + 0.05 * rise * np.clip((steps - 600) / 1400, 0, None) + 0.002 * rng.normal(size=evals)
        curves.append((steps, valid))
        best = int(np.argmin(valid))
        trials.append(TrialSummary(i + 1, i, {}, {}, "completed", float(valid[best]), int(steps[best])))
    screen = overfitting_screen(trials, stats(curves, int(steps[0])), None, 1.0, ())
    return screen["flagged"] / studies


def divergence_rate(kind: str, studies: int, rng: np.random.Generator) -> float:
    steps = np.arange(10, HORIZON + 1, 10)
    curves = []
    for _ in range(studies):
        loss = 0.1 + (math.log(10) - 0.1) * np.exp(-steps / 200) * (1 + 0.05 * rng.normal(size=steps.size))
        at = rng.integers(200, 1800)
        if kind == "blow-up":
            loss = np.where(steps >= at, 10 ** rng.uniform(3, 7) * (1 + 0.1 * rng.random(steps.size)), loss)
        elif kind == "mild rise":
            loss = np.where(steps >= at, 1.5 * math.log(10), loss)
        else:  # spikes: 30% of the late points jump to 10x the initial loss
            spikes = (steps >= 1500) & (rng.random(steps.size) < 0.3)
            loss = np.where(spikes, 10 * math.log(10), loss)
        curves.append((steps, loss))
    trials = [TrialSummary(i + 1, i, {}, {}, "completed", 0.1) for i in range(studies)]
    cut = int(0.75 * HORIZON)
    late = {i + 1: Curve(s[s >= cut], v[s >= cut]) for i, (s, v) in enumerate(curves)}
    return len(judge(trials, stats(curves, 10), late, "min", None)) / studies


def comparison_rate(gap: float, n: int, studies: int, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(studies):
        trials = [TrialSummary(k, k, {"a": k}, {}, "completed", 0.0) for k in (1, 2)]
        for arm, shift in ((1, 0.0), (2, gap)):
            for v in shift + rng.normal(size=n):
                i = len(trials) + 1
                trials.append(TrialSummary(i, i, {"a": arm}, {}, "completed", float(v), 1, arm))
        cmp = comparison(arm_summaries(trials, 1.0), 1.0)
        hits += cmp is not None and cmp["verdict"] == "different"
    return hits / studies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"overfitting screen ({args.studies} curves per cell): rate flagged")
    print("| rise after the best (share of 0.05) | 20 evaluations | 200 evaluations |")
    print("|---|---|---|")
    for rise in (0.0, 0.2, 0.5, 1.0):
        cells = [f"{overfit_rate(rise, e, args.studies, rng):.1%}" for e in (20, 200)]
        print(f"| {rise:.0%}{' (false alarm)' if rise == 0 else ''} | {' | '.join(cells)} |")
    print(f"\ndivergence on stored curves ({args.studies} curves per cell): rate judged diverged")
    print("| training loss | judged diverged |")
    print("|---|---|")
    for kind in ("blow-up", "mild rise", "spikes"):
        what = "" if kind == "blow-up" else " (false alarm)"
        print(f"| {kind}{what} | {divergence_rate(kind, args.studies, rng):.1%} |")
    print(f"\narm comparison ({args.studies // 4} pairs per cell): rate of verdict `different`")
    print("| gap (trial-variance sd) | 3 replicas | 5 | 10 | 30 |")
    print("|---|---|---|---|---|")
    for gap in (0.0, 0.5, 1.0, 2.0):
        cells = [f"{comparison_rate(gap, n, args.studies // 4, rng):.1%}" for n in (3, 5, 10, 30)]
        print(f"| {gap:g}{' (false alarm)' if gap == 0 else ''} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
