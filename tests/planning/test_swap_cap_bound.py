"""The swap-cap bound: no window-boundary rule that swaps at most `max_swaps` per layer per window
serves more assignments hot, and the bound is tight where it should be."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.analysis.simulate import run_dynamic, run_static, swap_cap_bound
from hotsplit_cli.hotset.planner import plan_hot_set


def _case(seed: int, S: int = 40, L: int = 3, E: int = 10, slots: int = 9):
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(E, 0.3), size=(2, L))  # two regimes: traffic drifts halfway
    counts = np.concatenate([rng.poisson(40 * shares[0], size=(S // 2, L, E)),
                             rng.poisson(40 * shares[1], size=(S - S // 2, L, E))]).astype(float)
    hot = plan_hot_set(counts[: S // 4].sum(axis=0), 1, slots).hot_RLE[0]
    return counts, hot


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(0, 3), st.sampled_from([0.0, 0.5, 0.8, 1.0]))
def test_no_dynamic_rule_serves_more_than_the_bound(seed, dyn_steps, max_swaps, decay):
    counts, hot = _case(seed)
    run = run_dynamic(counts, hot, dyn_steps, max_swaps, 1.0, decay=decay)
    bound = swap_cap_bound(counts, hot, dyn_steps, max_swaps)
    assert run.hits_S.sum() <= bound + 1e-9
    assert bound <= swap_cap_bound(counts, hot, dyn_steps, max_swaps, across_layers=True) + 1e-9
    assert bound <= swap_cap_bound(counts, hot, dyn_steps, max_swaps + 1) + 1e-9  # a looser cap never lowers it


def test_cap_zero_is_the_static_set_and_a_huge_cap_is_each_windows_best_per_layer():
    counts, hot = _case(3)
    assert swap_cap_bound(counts, hot, 5, 0) == run_static(counts, hot).hits_S.sum()
    n_L = hot.sum(axis=1)
    best = sum(np.sort(counts[a:a + 5].sum(axis=0)[layer])[::-1][: n_L[layer]].sum()
               for a in range(5, 40, 5) for layer in range(3))  # window 0 keeps the start set
    first = run_static(counts[:5], hot).hits_S.sum()
    assert swap_cap_bound(counts, hot, 5, 100) == first + best


def test_one_layer_worked_example():
    # Two slots on experts 0, 1; windows [5, 4, 0, 9], [0, 0, 8, 9], cap 1: window 0 serves 9;
    # window 1 may bring in one newcomer: best {3, 0 or 1} = 9 (or {2, 3} would need two).
    counts = np.array([[[5, 4, 0, 9]], [[0, 0, 8, 9]]], dtype=float)
    hot = np.array([[True, True, False, False]])
    assert swap_cap_bound(counts, hot, 1, 1) == 9 + 9
    assert swap_cap_bound(counts, hot, 1, 2) == 9 + 17
