"""Detection and false-alarm rates of the overfitting screen, the divergence rule on stored curves
and the arm comparison, simulated with the analysis' own functions; printed as tables for
docs/analysis.md.

- Overfitting screen (curves.overfitting_screen): validation error falls from chance (0.9) to
  0.05 by step 600 of 2,000, then rises by `rise` (relative to 0.05) to the end; Gaussian noise of
  sd 0.002 per evaluation; 20 or 200 evaluations. Rise 0 is the false-alarm case.
- Divergence (hpo.trainer.divergence.judge, the one definition): 200 logged training losses from
  ln 10 down to 0.1 (5% noise) and 20 evaluations of a 10-class error rate or accuracy, then one
  way of going wrong from a random step (detection) or a harmless look-alike (false alarm); see
  DIVERGENCE_KINDS.
- Lone outlier evaluations (outliers.robust_best): a glitched 0.0 at a random interior evaluation
  of a converged error-rate curve (detection), clean, quantized and lucky-last curves (false alarms).
- Infeasible trials concentrated in one categorical value (feasibility.value_concentration): 24
  trials over 3 values; one value always fails (detection) or failures are spread evenly.
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

from hpo.server.analysis.load import CurveStats
from hpo.server.analysis.model import Curve, TrialSummary
from hpo.server.analysis.rules.arms import arm_summaries, comparison
from hpo.server.analysis.rules.curves import overfitting_screen
from hpo.server.analysis.rules.feasibility import value_concentration
from hpo.server.analysis.rules.outliers import robust_best
from hpo.server.space.search_space import dimensions
from hpo.trainer.divergence import Series, judge

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
    last = np.array([float(steps.max()) for steps, _ in curves])
    return CurveStats(np.arange(1, len(curves) + 1), *(a[:, i] for i in range(10)), last)


def overfit_rate(rise: float, evals: int, studies: int, rng: np.random.Generator) -> float:
    steps = np.linspace(HORIZON / evals, HORIZON, evals).astype(int)
    curves, train, trials = [], [], []
    for i in range(studies):
        clean = 0.05 + 0.85 * np.exp(-steps / 120)
        valid = clean + 0.05 * rise * np.clip((steps - 600) / 1400, 0, None) + 0.002 * rng.normal(size=evals)
        curves.append((steps, valid))
        train.append((steps, 0.01 + 2.0 * np.exp(-steps / 300) * (1 + 0.03 * rng.normal(size=evals))))
        best = int(np.argmin(valid))
        trials.append(TrialSummary(i + 1, i, {}, {}, "completed", float(valid[best]), int(steps[best])))
    first = int(steps[0])
    screen = overfitting_screen(trials, stats(curves, first), stats(train, first), 1.0, ())
    return screen["flagged"] / studies


LOSS_STEPS = np.arange(10, HORIZON + 1, 10)
EVAL_STEPS = np.arange(100, HORIZON + 1, 100)
# (kind, is a detection case). Training loss unless the name says accuracy.
DIVERGENCE_KINDS = (
    ("NaN from a random step", True),
    ("blow-up to 1e3-1e7 that stays", True),
    ("blow-up ~1e6 for 5-30 logs, then back at chance", True),
    ("blow-up with a dip at the last 3 logs", True),
    ("collapse to chance after learning", True),
    ("slow climb to 2-6x the initial loss", True),
    ("accuracy at chance (10 classes, eval sd 0.016)", True),
    ("clean", False),
    ("2 logs spiking to 100x, then trains well", False),
    ("30% of late logs spiking to 10x", False),
    ("mild late rise to 1.5x its minimum", False),
    ("slow learner ending at 0.9x its initial loss", False),
    ("accuracy of a weak learner (0.13-0.2)", False),
)


def _loss(rng: np.random.Generator) -> np.ndarray:
    return 0.1 + (math.log(10) - 0.1) * np.exp(-LOSS_STEPS / 200) * (1 + 0.05 * rng.normal(size=LOSS_STEPS.size))


def planted_run(kind: str, rng: np.random.Generator) -> tuple[dict[str, Series], str, str]:
    """(curves, objective, mode) of one run of `kind`."""
    loss, initial = _loss(rng), math.log(10)
    at = int(rng.integers(200, 1800))
    late = at <= LOSS_STEPS
    error = 0.1 + 0.8 * np.exp(-EVAL_STEPS / 200) + 0.004 * rng.normal(size=EVAL_STEPS.size)
    if kind.startswith("NaN"):
        loss = np.where(late, np.nan, loss)
    elif kind.startswith("blow-up to"):
        loss = np.where(late, 10 ** rng.uniform(3, 7) * (1 + 0.1 * rng.random(LOSS_STEPS.size)), loss)
    elif kind.startswith("blow-up ~1e6"):
        stretch = late & (at + 10 * int(rng.integers(5, 31)) > LOSS_STEPS)
        loss = np.where(stretch, 1e6 * initial, np.where(late & ~stretch, initial + 0.01 * rng.normal(), loss))
    elif kind.startswith("blow-up with a dip"):
        loss = np.where(late, 50 * initial, loss)
        loss[-3:] = 0.1
    elif kind.startswith("collapse"):
        loss = np.where(late, initial * (1 + 0.01 * rng.normal(size=LOSS_STEPS.size)), loss)
        error = np.where(at <= EVAL_STEPS, 0.9, error)
    elif kind.startswith("slow climb"):
        top = rng.uniform(2, 6) * initial
        loss = np.where(late, loss + (top - loss) * (LOSS_STEPS - at) / max(HORIZON - at, 1), loss)
    elif kind.startswith("2 logs"):
        loss[int(rng.integers(20, 150)) + np.arange(2)] = 100 * initial
    elif kind.startswith("30%"):
        loss = np.where((LOSS_STEPS >= 1500) & (rng.random(LOSS_STEPS.size) < 0.3), 10 * initial, loss)
    elif kind.startswith("mild"):
        loss = np.where(LOSS_STEPS >= 1500, 1.5 * np.min(loss), loss)
    elif kind.startswith("slow learner"):
        loss = initial * (0.9 + 0.1 * np.exp(-LOSS_STEPS / 400)) * (1 + 0.005 * rng.normal(size=LOSS_STEPS.size))
    curves = {"train/loss": Series(LOSS_STEPS, loss), "valid/error_rate": Series(EVAL_STEPS, error)}
    if kind.startswith("accuracy"):
        level = 0.1 if "chance" in kind else rng.uniform(0.13, 0.2)
        acc = level + 0.016 * rng.normal(size=EVAL_STEPS.size)
        curves = {"train/loss": Series(LOSS_STEPS, _loss(rng)), "valid/accuracy": Series(EVAL_STEPS, acc)}
        return curves, "valid/accuracy", "max"
    return curves, "valid/error_rate", "min"


def divergence_rate(kind: str, studies: int, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(studies):
        curves, objective, mode = planted_run(kind, rng)
        chance = (0.1, 1.0) if mode == "max" else (0.9, 0.0)
        hits += judge(curves, objective, mode, chance=chance) is not None
    return hits / studies


def outlier_rate(kind: str, evals: int, studies: int, rng: np.random.Generator) -> float:
    steps = np.linspace(HORIZON / evals, HORIZON, evals)
    hits = 0
    for _ in range(studies):
        values = 0.1 + 0.8 * np.exp(-steps / 200) + 0.004 * rng.normal(size=evals)
        if kind == "glitch":
            values[int(rng.integers(evals // 3, evals - 1))] = 0.0
        elif kind == "quantized":
            values = np.round(values * 360) / 360
        elif kind == "lucky last":
            values[-1] = 0.1 - 0.012
        hits += robust_best(Curve(steps, values), 1.0) is not None
    return hits / studies


SPACE = dimensions(
    {"hyperparameters": [{"name": "activation", "role": "nuisance", "type": "categorical", "values": ["a", "b", "c"]}]}
)


def value_rate(kind: str, studies: int, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(studies):
        trials = []
        for i in range(24):
            value = "abc"[i % 3]
            bad = (value == "c" or rng.random() < 0.1) if kind == "one value fails" else rng.random() < 0.3
            trials.append(TrialSummary(i + 1, i, {}, {"activation": value}, "infeasible" if bad else "completed", 0.1))
        hits += value_concentration(SPACE, trials) is not None
    return hits / studies


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
    print(f"\ndivergence, one definition ({args.studies} runs per row): rate judged diverged")
    print("| run | judged diverged |")
    print("|---|---|")
    for kind, detection in DIVERGENCE_KINDS:
        print(f"| {kind}{'' if detection else ' (false alarm)'} | {divergence_rate(kind, args.studies, rng):.1%} |")
    print(f"\nlone outlier evaluation ({args.studies} curves per cell): rate flagged")
    print("| curve | 20 evaluations | 200 evaluations |")
    print("|---|---|---|")
    for kind in ("glitch", "clean", "quantized", "lucky last"):
        cells = [f"{outlier_rate(kind, e, args.studies, rng):.1%}" for e in (20, 200)]
        print(f"| {kind}{'' if kind == 'glitch' else ' (false alarm)'} | {' | '.join(cells)} |")
    print(f"\ninfeasible trials concentrated in one value ({args.studies // 4} studies of 24 trials): rate named")
    print("| failures | a value named |")
    print("|---|---|")
    for kind in ("one value fails", "30% spread evenly"):
        what = "" if kind == "one value fails" else " (false alarm)"
        print(f"| {kind}{what} | {value_rate(kind, args.studies // 4, rng):.1%} |")
    print(f"\narm comparison ({args.studies // 4} pairs per cell): rate of verdict `different`")
    print("| gap (trial-variance sd) | 3 replicas | 5 | 10 | 30 |")
    print("|---|---|---|---|---|")
    for gap in (0.0, 0.5, 1.0, 2.0):
        cells = [f"{comparison_rate(gap, n, args.studies // 4, rng):.1%}" for n in (3, 5, 10, 30)]
        print(f"| {gap:g}{' (false alarm)' if gap == 0 else ''} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
