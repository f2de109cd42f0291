"""The Figure 3 bootstrap in closed form against a Monte Carlo bootstrap, and its flattening rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import qmc

from hpo.server.analysis.rules.budget import best_of_k, budget_ks, flattened


def test_quantiles_and_mean_match_a_monte_carlo_bootstrap() -> None:
    rng = np.random.default_rng(0)
    values: list[float | None] = [*rng.normal(size=30).tolist(), None, None, None]
    curve = best_of_k(values, 1.0)
    pool = np.array([np.inf if v is None else v for v in values])
    worst = max(v for v in values if v is not None)
    for k in (1, 4, 16, 33):
        draws = pool[rng.integers(0, len(pool), size=(100_000, k))].min(axis=1)
        i = curve.ks.index(k)
        for q in (0.05, 0.25, 0.5, 0.75):
            assert curve.quantiles[q][i] == np.quantile(draws, q, method="inverted_cdf")
        assert curve.mean[i] == pytest.approx(np.where(np.isinf(draws), worst, draws).mean(), abs=0.01)


def test_max_mode_and_all_infeasible_draws() -> None:
    curve = best_of_k([0.5, 0.9, None, None, None], -1.0, ks=[1, 5])
    assert curve.quantiles[0.5] == [None, 0.9]  # one draw is more often infeasible than not
    assert curve.quantiles[0.05][1] == 0.9


def test_ks_grid_keeps_one_half_and_all() -> None:
    assert budget_ks(5) == [1, 2, 3, 4, 5]
    ks = budget_ks(1000)
    assert ks[0] == 1 and 500 in ks and ks[-1] == 1000 and len(ks) <= 42 and ks == sorted(set(ks))


def _valley(n: int, dims: int, seed: int) -> list[float | None]:
    u = qmc.Halton(dims, scramble=True, seed=seed).random(n)
    return list(((u - 0.5) ** 2).sum(axis=1))


def test_flattens_with_enough_trials_for_the_dimensions() -> None:
    assert all(flattened(best_of_k(_valley(40, 1, s), 1.0), 1.0)[0] for s in range(10))
    assert not any(flattened(best_of_k(_valley(12, 3, s), 1.0), 1.0)[0] for s in range(10))
    assert not flattened(best_of_k([0.3, 0.2, 0.1], 1.0), 1.0)[0]  # under 4 trials never counts as flat


def test_retrain_noise_counts_as_flat() -> None:
    values = _valley(12, 3, 0)
    flat, facts = flattened(best_of_k(values, 1.0), 1.0)
    assert not flat
    assert flattened(best_of_k(values, 1.0), 1.0, noise=facts["gain_last_half"] * 1.01)[0]


def test_quantile_labels_follow_the_values_in_max_mode() -> None:
    """`p5` is the lower value in both modes (in `max` mode the oriented 5% is the values' 95th)."""
    accuracies = [0.5, 0.6, 0.7, 0.8, 0.9]
    for sign in (1.0, -1.0):
        shown = best_of_k(accuracies, sign, ks=[1]).as_dict()
        assert shown["p5"][0] <= shown["p25"][0] <= shown["median"][0] <= shown["p75"][0] <= shown["p95"][0]
    assert best_of_k(accuracies, -1.0, ks=[1]).as_dict()["p95"][0] == 0.9
