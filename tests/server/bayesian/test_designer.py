"""The designer alone (no database): proposals stay in the unit cube, never repeat a pending
point, are reproducible, and keep away from a planted infeasible region."""

from __future__ import annotations

import numpy as np

from hpo.server.bayesian.designer import Problem, propose


def _bowl(u: list[float]) -> float:
    return (u[0] - 0.9) ** 2 + (u[1] - 0.5) ** 2


def _halton(n: int, d: int = 2) -> list[list[float]]:
    from scipy.stats import qmc

    return qmc.Halton(d, scramble=True, seed=3).random(n).tolist()


def _snap_thirds(point: list[float]) -> list[float]:
    # The second dimension takes three values (a categorical's cell centres).
    return [point[0], (min(int(point[1] * 3), 2) + 0.5) / 3]


def test_proposals_are_in_the_cube_distinct_and_reproducible() -> None:
    observed = _halton(8)
    values: list[float | None] = [_bowl(u) for u in observed]
    pending = [_snap_thirds(u) for u in _halton(12)[8:]]
    problem = Problem(dims=2, observed=observed, values=values, pending=pending, q=3, seed=5, snap=_snap_thirds)
    first = propose(problem)
    assert first.model == "gp"
    assert len(first.points) == 3
    keys = {tuple(round(u, 9) for u in p) for p in first.points}
    assert len(keys) == 3
    assert not keys & {tuple(round(u, 9) for u in p) for p in pending}
    for point in first.points:
        assert all(0.0 <= u <= 1.0 for u in point)
        assert point[1] in (1 / 6, 0.5, 5 / 6)
    assert propose(problem).points == first.points  # the same problem, the same points
    assert first.view is not None and len(first.view["slices"]) == 2


def test_proposals_avoid_a_planted_infeasible_region() -> None:
    # The unconstrained optimum (u0 = 0.9) lies in the infeasible half u0 > 0.5: an objective model
    # alone extrapolates towards it; the feasibility model must hold the proposals back.
    observed = _halton(14)
    values = [None if u[0] > 0.5 else _bowl(u) for u in observed]
    proposal = propose(Problem(dims=2, observed=observed, values=values, pending=[], q=4, seed=2))
    assert proposal.model == "gp+feasibility"
    inside = [p for p in proposal.points if p[0] <= 0.55]
    assert len(inside) >= 3, proposal.points
    slices = proposal.view["slices"] if proposal.view else []
    feasible = np.array(slices[0]["feasible"])
    assert feasible[:5].mean() > 0.7 > feasible[-5:].mean()  # the model's view shows the boundary


def test_too_few_feasible_results_fall_back_on_the_quasi_random_sequence() -> None:
    continuation = _halton(4)
    proposal = propose(Problem(dims=2, observed=[], values=[], pending=[], q=2, seed=1, fallback=continuation))
    assert proposal.model == "random"
    assert proposal.points == continuation[:2]


def test_noise_is_inferred_from_the_data_smooth_or_noisy() -> None:
    """The wide noise prior lets a smooth objective be modelled nearly exactly, and still infers a
    noisy one's noise (trials of real training runs are noisy: a seed changes the result)."""
    import torch

    from hpo.server.bayesian.designer import _fit_gp

    x = torch.tensor(_halton(40), dtype=torch.double)
    smooth = torch.tensor([[_bowl(u)] for u in x.tolist()], dtype=torch.double)
    rng = np.random.default_rng(0)
    noise_std = 0.05  # the bowl spans about 0.9: a noise std of about a fifth of its spread
    noisy = smooth + torch.tensor(rng.normal(0, noise_std, size=(40, 1)))

    def inferred_std(y: torch.Tensor) -> float:
        model = _fit_gp(x, y)
        # the likelihood's noise is in standardized units; back to the objective's own
        return float(model.likelihood.noise.item() ** 0.5 * y.std().item())

    assert inferred_std(smooth) < 0.001  # BoTorch's default prior and floor hold it at 0.0025 here
    assert 0.5 * noise_std < inferred_std(noisy) < 2 * noise_std
