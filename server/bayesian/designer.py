"""The designer: given observations in the unit cube, the next points to try. BoTorch does the
statistics (docs/decisions.md, "Bayesian optimization": BoTorch, not Optuna's GP sampler); this
module only assembles its three pieces:

- a model: `SingleTaskGP` on the feasible trials' objective (BoTorch's default kernel: RBF with a
  dimension-scaled log-normal lengthscale prior; standardized outcomes; our own noise prior, see
  `_likelihood`), fitted with `fit_gpytorch_mll`; when some trials were infeasible, a second `SingleTaskGP` on the 0/1
  feasibility of every finished trial, in the spirit of "Bayesian optimization with unknown
  constraints" (Gelbart et al. 2014; the playbook's advice in "After exploration concludes");
- an acquisition function: `qLogNoisyExpectedImprovement`, with the running and pending trials as
  `X_pending` (fantasized over, so concurrent workers get different points) and, with a feasibility
  model, plus the log probability that the feasibility GP is above 0.5 (expected improvement
  weighed by the probability of feasibility, Gelbart et al.'s constrained EI);
- an optimizer: `optimize_acqf` over the unit cube, sequential greedy for a batch, seeded.

Pure: no database, no spec. The same `Problem` gives the same points (the torch generator is seeded
from `Problem.seed`, in a forked RNG state). It runs in a child process of the server (queue.py),
so the torch import and the fits never hold the server's GIL."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_log = logging.getLogger("hpo.server.bayesian")

# A point in the unit cube, one coordinate per modelled dimension.
Point = list[float]
Snap = Callable[[Point], Point]

VIEW_STEPS = 21
# Noisy EI's baseline: the incumbent is among the best observed points, so the acquisition's joint
# posterior (its cost grows with the cube of the baseline) covers only the best few.
BASELINE = 32
# A cap on each hyperparameter fit: past a few hundred observations the fit, not the acquisition,
# would dominate a proposal; BoTorch keeps the best parameters found when time runs out.
FIT_SECONDS = 2.0
FIT_MAXITER = 150
# Quasi-Monte Carlo samples of the acquisition (BoTorch's default is 512 for qLogNEI's helpers;
# 64 Sobol samples estimate a batch of a few points well enough and cost an eighth).
MC_SAMPLES = 64
ACQ_MAXITER = 100
SEQUENTIAL = True
# The GP's noise variance (standardized units): its floor and log-normal prior (see `_likelihood`).
MIN_NOISE = 1e-6
NOISE_PRIOR = (-8.0, 2.0)
# Below this many feasible observations the objective GP is not worth fitting.
MIN_FEASIBLE = 2


@dataclass(frozen=True)
class Problem:
    """What the designer needs. `values[i]` is the objective of `observed[i]`, None when that trial
    was infeasible; `minimize` says which way is better."""

    dims: int
    observed: list[Point]
    values: list[float | None]
    pending: list[Point]
    q: int
    seed: int
    minimize: bool = True
    # Rounds a unit point to one the space can take (the centre of a categorical value's cell, a
    # whole number's); identity for continuous dimensions. Picklable (it crosses processes).
    snap: Snap | None = None
    # Points to fall back on while too few results are feasible to model the objective: the
    # continuation of the study's quasi-random sequence (at least q of them); Sobol points if empty.
    fallback: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class Proposal:
    """Points to try, how they were chosen (`model`: gp, gp+feasibility, feasibility, random) and
    the model's view around the best point (`view`, None without a fitted objective model)."""

    points: list[Point]
    model: str
    fit_seconds: float
    view: dict[str, Any] | None = field(default=None)


def propose(problem: Problem, *, raw_samples: int = 256, num_restarts: int = 6) -> Proposal:
    """`problem.q` new points in the unit cube, none equal to a pending point or to another of the
    batch after snapping."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch

    start = time.perf_counter()
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch's numerical and input-data warnings: expected here
        torch.manual_seed(problem.seed)
        problem = _finite_only(problem)
        try:
            points, model, view = _propose(problem, raw_samples, num_restarts)
        except Exception:  # a numerical failure must not stall the study: quasi-random points instead
            _log.exception("bayesian designer failed; proposing quasi-random points")
            points, model, view = _fallback(problem, None), "random", None
        points = _distinct(problem, [p if all(math.isfinite(u) for u in p) else _random(problem) for p in points])
    return Proposal(points=points, model=model, fit_seconds=time.perf_counter() - start, view=view)


def _propose(problem: Problem, raw_samples: int, num_restarts: int) -> tuple[list[Point], str, dict[str, Any] | None]:
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch

    if problem.dims == 0:
        return [[] for _ in range(problem.q)], "random", None
    dtype = torch.double
    sign = -1.0 if problem.minimize else 1.0
    feasible = [
        (x, sign * v)
        for x, v in zip(problem.observed, problem.values, strict=True)
        if v is not None and math.isfinite(v)
    ]
    any_infeasible = len(feasible) < len(problem.observed)
    feasibility = _fit_feasibility(problem) if any_infeasible else None
    if len(feasible) < MIN_FEASIBLE:
        return _fallback(problem, feasibility), ("feasibility" if feasibility is not None else "random"), None
    x = torch.tensor([p for p, _ in feasible], dtype=dtype)
    y = torch.tensor([[v] for _, v in feasible], dtype=dtype)
    objective_model = _fit_gp(x, y)
    baseline = x[torch.argsort(y.squeeze(-1), descending=True)[:BASELINE]]
    points = _optimize(problem, objective_model, baseline, feasibility, raw_samples, num_restarts)
    view = _view(problem, objective_model, feasibility, x, y, sign)
    return points, ("gp" if feasibility is None else "gp+feasibility"), view


def _finite_only(problem: Problem) -> Problem:
    """Leaves out observations and pending points with a coordinate that is not a number."""
    keep = [i for i, p in enumerate(problem.observed) if all(math.isfinite(u) for u in p)]
    return dataclasses.replace(
        problem,
        observed=[problem.observed[i] for i in keep],
        values=[problem.values[i] for i in keep],
        pending=[p for p in problem.pending if all(math.isfinite(u) for u in p)],
    )


def _random(problem: Problem) -> Point:
    return np.random.default_rng([problem.seed, 2]).random(problem.dims).tolist()


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _fit_gp(x: Any, y: Any) -> Any:
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model = SingleTaskGP(x, y, likelihood=_likelihood(), outcome_transform=Standardize(m=1))
    # A failed fit keeps the prior's hyperparameters: still a usable model.
    with contextlib.suppress(Exception):
        fit_gpytorch_mll(
            ExactMarginalLogLikelihood(model.likelihood, model),
            optimizer_kwargs={"options": {"maxiter": FIT_MAXITER}, "timeout_sec": FIT_SECONDS},
        )
    return model


def _likelihood() -> Any:
    """Gaussian noise with the noise level inferred, allowed down to 1e-6 of the standardized
    variance under a wide log-normal prior. BoTorch's default (LogNormal(-4, 1), at least 1e-4)
    holds the noise near 0.02, i.e. a noise std of 13 % of the objective's spread: on a smooth
    objective it blurs the last digits the exploitation phase is for (Branin's median regret
    0.011 against 0.0005 with this prior, bench/bayesian_bench.py), while noisy trials still get
    their noise inferred from the data (tests/server/bayesian/test_designer.py)."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    from gpytorch.constraints import GreaterThan
    from gpytorch.likelihoods import GaussianLikelihood
    from gpytorch.priors import LogNormalPrior

    prior = LogNormalPrior(loc=NOISE_PRIOR[0], scale=NOISE_PRIOR[1])
    return GaussianLikelihood(
        noise_prior=prior, noise_constraint=GreaterThan(MIN_NOISE, transform=None, initial_value=prior.mode)
    )


def _fit_feasibility(problem: Problem) -> Any:
    """A GP on 1 (feasible) / 0 (infeasible) over every finished trial: a regression stand-in for
    a classifier, cheap and smooth; its mean clipped to [0, 1] reads as a probability."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch

    x = torch.tensor(problem.observed, dtype=torch.double)
    y = torch.tensor([[1.0 if _finite(v) else 0.0] for v in problem.values], dtype=torch.double)
    return _fit_gp(x, y)


def _optimize(
    problem: Problem, model: Any, baseline: Any, feasibility: Any, raw_samples: int, num_restarts: int
) -> list[Point]:
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.optim import optimize_acqf
    from botorch.sampling import SobolQMCNormalSampler

    pending = torch.tensor(problem.pending, dtype=torch.double) if problem.pending else None
    acquisition: Any = qLogNoisyExpectedImprovement(
        model=model,
        X_baseline=baseline,
        sampler=SobolQMCNormalSampler(sample_shape=torch.Size([MC_SAMPLES]), seed=problem.seed),
        X_pending=pending,
        prune_baseline=True,
    )
    if feasibility is not None:
        acquisition = _feasibility_weighted(acquisition, feasibility)
    bounds = torch.stack([torch.zeros(problem.dims), torch.ones(problem.dims)]).to(torch.double)
    candidates, _ = optimize_acqf(
        acquisition,
        bounds=bounds,
        q=problem.q,
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        sequential=True,
        options={"batch_limit": num_restarts, "maxiter": ACQ_MAXITER, "seed": problem.seed},
    )
    return [[min(max(float(u), 0.0), 1.0) for u in row] for row in candidates.tolist()]


def _feasibility_weighted(improvement: Any, feasibility: Any) -> Any:
    """log EI + log P(feasible): expected improvement weighed by the probability of feasibility,
    the constrained EI of Gelbart et al. (2014), P from the feasibility GP's posterior at each
    point of the batch (mean over the 0.5 threshold, in standard deviations). Pending points go to
    the improvement term, where they are fantasized."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch
    from botorch.acquisition import AcquisitionFunction

    class FeasibilityWeighted(AcquisitionFunction):
        def __init__(self) -> None:
            super().__init__(model=improvement.model)
            self.improvement = improvement
            self.feasibility = feasibility

        @property
        def X_pending(self) -> Any:  # type: ignore[override]
            return self.improvement.X_pending

        @X_pending.setter
        def X_pending(self, value: Any) -> None:
            pass  # held by the improvement term

        def set_X_pending(self, X_pending: Any = None) -> None:
            self.improvement.set_X_pending(X_pending)

        def forward(self, X: Any) -> Any:
            posterior = self.feasibility.posterior(X)
            mean = posterior.mean.squeeze(-1)
            std = posterior.variance.clamp_min(1e-12).sqrt().squeeze(-1)
            log_feasible = torch.special.log_ndtr((mean - 0.5) / std).sum(dim=-1)
            return self.improvement(X) + log_feasible

    return FeasibilityWeighted()


def _fallback(problem: Problem, feasibility: Any) -> list[Point]:
    """Too few feasible results to model the objective: the next quasi-random points; with a
    feasibility model, the q most likely feasible of 64 Sobol points instead."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch
    from botorch.utils.sampling import draw_sobol_samples

    if feasibility is None and len(problem.fallback) >= problem.q:
        return [list(p) for p in problem.fallback[: problem.q]]
    bounds = torch.stack([torch.zeros(problem.dims), torch.ones(problem.dims)]).to(torch.double)
    pool = draw_sobol_samples(bounds=bounds, n=64, q=1, seed=problem.seed).squeeze(1)
    if feasibility is not None:
        with torch.no_grad():
            score = feasibility.posterior(pool).mean.squeeze(-1)
        pool = pool[torch.argsort(score, descending=True)]
    return [[float(u) for u in row] for row in pool[: problem.q].tolist()]


def _distinct(problem: Problem, points: list[Point]) -> list[Point]:
    """Snaps each point and replaces any that repeats a pending point or an earlier one of the
    batch by a seeded random point that does not (after 100 tries, keeps the repeat: a space of a
    few discrete values may simply be exhausted)."""
    snap = problem.snap or (lambda p: p)
    taken = {_key(snap(p)) for p in problem.pending}
    rng = np.random.default_rng([problem.seed, 1])
    out = []
    for point in points:
        candidate = _snapped(snap, point)
        tries = 0
        while _key(candidate) in taken and tries < 100:
            candidate = _snapped(snap, rng.random(problem.dims).tolist())
            tries += 1
        taken.add(_key(candidate))
        out.append(candidate)
    return out


def _snapped(snap: Snap, point: Point) -> Point:
    """The snapped point, or the point itself where snapping gives something not a number (a
    value the space refuses must never reach the database as NaN)."""
    candidate = snap(point)
    return candidate if all(math.isfinite(u) for u in candidate) else point


def _key(point: Sequence[float]) -> tuple[float, ...]:
    return tuple(round(u, 9) for u in point)


def _view(problem: Problem, objective: Any, feasibility: Any, x: Any, y: Any, sign: float) -> dict[str, Any]:
    """The model's predicted objective (mean, std, in the objective's own units) and probability of
    feasibility along each dimension through the best observed feasible point, the others held."""
    # lazy: torch and BoTorch load only where the fits run (module docstring)
    import torch

    best = x[int(torch.argmax(y))]
    grid = torch.linspace(0.0, 1.0, VIEW_STEPS, dtype=torch.double)
    slices = []
    with torch.no_grad():
        for dim in range(problem.dims):
            points = best.repeat(VIEW_STEPS, 1)
            points[:, dim] = grid
            posterior = objective.posterior(points)
            mean = (sign * posterior.mean.squeeze(-1)).tolist()
            std = posterior.variance.clamp_min(0).sqrt().squeeze(-1).tolist()
            slice_: dict[str, Any] = {"unit": grid.tolist(), "mean": mean, "std": std}
            if feasibility is not None:
                slice_["feasible"] = feasibility.posterior(points).mean.squeeze(-1).clamp(0, 1).tolist()
            slices.append(slice_)
    return {"best_unit": best.tolist(), "slices": slices}
