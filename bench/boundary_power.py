"""Detection and false-alarm rates of the boundary rule (server/analysis/rules/boundary.py), simulated over
scrambled Halton designs of 8, 12 and 24 trials per arm, printed as a table for docs/analysis.md.

Each simulated study varies a log-scaled learning rate (position u in [0, 1]) and two
hyperparameters that do not matter (a log-scaled weight decay and a reverse-log momentum). The
objective (lower is better) is one of:

- trend:    0.1 + 0.5 (u - 1.3)^2      optimum beyond the max edge, improving across the range;
- cliff:    0.1 if u < 0.1 else 0.3    optimum at the min edge, flat elsewhere (no trend);
- interior: 0.1 + 0.5 (u - 0.5)^2      optimum in the middle;
- near:     0.1 + 0.5 (u - 0.25)^2     optimum inside but near the min edge;

plus Gaussian noise of standard deviation `--noise` (default 0.01). Detection: the learning rate is
flagged on the right side (trend: max, cliff: min). False alarm: the learning rate is flagged for an
interior optimum, or either irrelevant hyperparameter is flagged in any study.

    .venv/bin/python bench/boundary_power.py [--studies 1000] [--noise 0.01]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from scipy.stats import qmc

from hpo.server.analysis.model import TrialSummary, arm_key
from hpo.server.analysis.rules.boundary import check_boundaries
from hpo.server.space.search_space import Dimension, from_unit

LR = Dimension("learning_rate", "nuisance", "float", 1e-4, 1.0, "log")
WD = Dimension("weight_decay", "nuisance", "float", 1e-6, 1e-2, "log")
MOMENTUM = Dimension("momentum", "nuisance", "float", 0.8, 0.999, "reverse_log")
DIMS = [LR, WD, MOMENTUM]

SHAPES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str | None]] = {
    "trend": (lambda u: 0.1 + 0.5 * (u - 1.3) ** 2, "max"),
    "cliff": (lambda u: np.where(u < 0.1, 0.1, 0.3), "min"),
    "interior": (lambda u: 0.1 + 0.5 * (u - 0.5) ** 2, None),
    "near": (lambda u: 0.1 + 0.5 * (u - 0.25) ** 2, None),
}


def simulate(shape: str, n: int, studies: int, noise: float, gate: bool = False) -> tuple[float, float, float]:
    """(rate the learning rate is flagged on the expected side or, for interior shapes, at all;
    rate an irrelevant hyperparameter is flagged; rate of either). With `gate` the rule is told the
    noise (as replicas would measure it) and drops edges that beat the rest by less than it."""
    f, expected = SHAPES[shape]
    lr_hits = other_hits = 0
    for seed in range(studies):
        points = qmc.Halton(3, scramble=True, seed=seed).random(n)
        rng = np.random.default_rng(10_000 + seed)
        y = f(points[:, 0]) + noise * rng.normal(size=n)
        trials = [
            TrialSummary(
                id=i + 1,
                number=i,
                arm={},
                params={d.name: from_unit(d, float(points[i, k])) for k, d in enumerate(DIMS)},
                status="completed",
                objective=float(y[i]),
            )
            for i in range(n)
        ]
        floors = {arm_key({}): noise} if gate else None
        sides = {c.dim.name: c.side for c in check_boundaries(DIMS, trials, 1.0, noise=floors)}
        lr = sides.get("learning_rate")
        lr_hits += (lr == expected) if expected else (lr is not None)
        other_hits += any(sides.get(d.name) for d in DIMS[1:])
    return lr_hits / studies, other_hits / studies, 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args()
    print(f"boundary rule over scrambled Halton designs, {args.studies} studies each, noise sd {args.noise}")
    print("| shape | trials per arm | learning rate flagged | irrelevant hyperparameter flagged |", end="")
    print(" with the noise gate: learning rate | irrelevant |")
    print("|---|---|---|---|---|---|")
    for shape, (_, expected) in SHAPES.items():
        for n in (8, 12, 24):
            lr, other, _ = simulate(shape, n, args.studies, args.noise)
            lr_gated, other_gated, _ = simulate(shape, n, args.studies, args.noise, gate=True)
            what = f"detection ({expected} side)" if expected else "false alarm"
            print(f"| {shape} | {n} | {lr:.1%} {what} | {other:.1%} false alarm | {lr_gated:.1%} | {other_gated:.1%} |")


if __name__ == "__main__":
    main()
