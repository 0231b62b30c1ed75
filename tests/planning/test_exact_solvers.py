"""The exact knapsack solvers on their own (brute force, the size-class DP) and their limits:
each checked against the other on problems where every size class and fractional values matter,
the tie rule (fewest bytes), and where each solver's limit falls."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset import planner
from hotsplit_cli.hotset.planner import BRUTE_FORCE_MAX_ITEMS, brute_force_select, dp_select


def _value(values, chosen) -> float:
    return float(np.asarray(values)[chosen].sum())


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force_with_fractional_values_and_every_size_class(seed):
    """Values below 1 (a reranked histogram's counts are fractional) and three size classes, each
    of which the optimum uses for some seed: the DP's value is the brute-force optimum."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 12))
    values = rng.random(n) * rng.choice([0.01, 1.0, 100.0])
    sizes = rng.choice([3, 5, 7], n)
    budget = int(rng.integers(3, sizes.sum()))
    exact = dp_select(values, sizes, budget)
    best = brute_force_select(values, sizes, budget)
    assert exact is not None and int(sizes[exact].sum()) <= budget
    assert _value(values, exact) == pytest.approx(_value(values, best), rel=1e-12, abs=1e-15)


def test_dp_uses_the_largest_size_class_when_it_pays():
    values = np.array([0.5, 0.4, 3.0])
    sizes = np.array([2, 2, 4])
    chosen = dp_select(values, sizes, 4)
    assert chosen.tolist() == [False, False, True]  # 3.0 beats 0.5 + 0.4 in the same 4 bytes


def test_brute_force_prefers_the_fewest_bytes_among_equal_values():
    values = np.array([4.0, 4.0, 1.0])
    sizes = np.array([3, 2, 5])
    assert brute_force_select(values, sizes, 3).tolist() == [False, True, False]


def test_brute_force_takes_up_to_its_limit_and_refuses_beyond_it():
    n = BRUTE_FORCE_MAX_ITEMS
    values = np.arange(1, n + 1, dtype=np.float64)
    sizes = np.ones(n, dtype=np.int64)
    assert brute_force_select(values, sizes, 2).tolist() == [False] * (n - 2) + [True, True]
    with pytest.raises(PlanError) as exc:
        brute_force_select(np.ones(n + 1), np.ones(n + 1, dtype=np.int64), 2)
    assert str(exc.value) == f"brute force is limited to {n} items, got {n + 1}"


def test_the_dp_runs_up_to_its_cell_limit_exactly(monkeypatch):
    """The DP table has (budget / gcd + 1) x (items + size classes) cells: at the limit it runs,
    one cell beyond it the DP declines (None)."""
    values = np.array([3.0, 2.0, 1.0])
    sizes = np.array([2, 3, 3])
    budget = 5
    cells = (budget + 1) * (3 + 2)
    monkeypatch.setattr(planner, "DP_MAX_CELLS", cells)
    assert dp_select(values, sizes, budget).tolist() == [True, True, False]
    monkeypatch.setattr(planner, "DP_MAX_CELLS", cells - 1)
    assert dp_select(values, sizes, budget) is None
