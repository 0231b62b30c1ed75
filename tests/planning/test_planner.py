import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hotsplit_cli.core.errors import BudgetOverflowError, HistogramError, PlanError
from hotsplit_cli.hotset.planner import (
    brute_force_select,
    contiguous_owner,
    greedy_select,
    lp_bound,
    plan_hot_set,
    propose_swaps,
    select,
)

counts_st = st.integers(1, 4).flatmap(
    lambda L: st.integers(2, 6).flatmap(
        lambda E: arrays(np.float64, (L, E), elements=st.integers(0, 50).map(float)).filter(lambda a: a.any())
    )
)


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, size=st.integers(1, 5), budget=st.integers(0, 40))
def test_hot_bytes_never_exceed_budget_and_bound_holds(counts, size, budget):
    plan = plan_hot_set(counts, size, budget)
    assert plan.hot_bytes_R.max() <= budget
    assert plan.hot_bytes_R[0] == plan.hot_RLE[0].sum() * size
    assert plan.hit_rate <= plan.bound_hit_rate + 1e-12
    assert plan.greedy_hit_rate <= plan.hit_rate + 1e-12


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, size=st.integers(1, 5), budget=st.integers(0, 30), extra=st.integers(0, 10))
def test_larger_budget_never_lowers_hit_rate(counts, size, budget, extra):
    assert plan_hot_set(counts, size, budget + extra).hit_rate >= plan_hot_set(counts, size, budget).hit_rate - 1e-12


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, budget=st.integers(0, 12), seed=st.integers(0, 1000))
def test_permuting_experts_permutes_the_plan(counts, budget, seed):
    # Distinct counts so that tie-breaking by id cannot differ between orders.
    L, E = counts.shape
    counts = counts * 1000 + np.arange(L * E).reshape(L, E)
    perm = np.random.default_rng(seed).permutation(E)
    a = plan_hot_set(counts, 1, budget).hot_RLE[0]
    b = plan_hot_set(counts[:, perm], 1, budget).hot_RLE[0]
    np.testing.assert_array_equal(a[:, perm], b)


@settings(max_examples=150, deadline=None)
@given(values=arrays(np.float64, st.integers(1, 10), elements=st.integers(0, 30).map(float)),
       size=st.integers(1, 4), budget=st.integers(0, 30))
def test_greedy_equals_brute_force_on_equal_sizes(values, size, budget):
    sizes = np.full(len(values), size)
    g = values[greedy_select(values, sizes, budget)].sum()
    b = values[brute_force_select(values, sizes, budget)].sum()
    assert g == pytest.approx(b)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_exact_beats_or_matches_greedy_and_lp_bounds_both(data):
    n = data.draw(st.integers(1, 12))
    values = np.array(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=float)
    sizes = np.array(data.draw(st.lists(st.sampled_from([2, 3, 5, 7]), min_size=n, max_size=n)))
    budget = data.draw(st.integers(0, 40))
    sel = select(values, sizes, budget)
    best = values[brute_force_select(values, sizes, budget)].sum()
    assert sel.certified
    assert sel.value == pytest.approx(best)
    assert sel.value >= sel.greedy_value - 1e-9
    assert lp_bound(values, sizes, budget) >= best - 1e-9


def test_dp_matches_brute_force_beyond_brute_force_size():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 14
        values = rng.integers(0, 100, n).astype(float)
        sizes = rng.choice([4, 6, 10], n)
        budget = int(rng.integers(10, 50))
        best = values[brute_force_select(values, sizes, budget)].sum()
        # Force the DP path by offering more positive items than brute force handles.
        pad_v = np.concatenate([values, np.full(10, 0.001)])
        pad_s = np.concatenate([sizes, np.full(10, 1000)])
        sel = select(pad_v, pad_s, budget)
        assert sel.method in ("dp", "greedy (dp-certified)")
        assert sel.value == pytest.approx(best)


def test_greedy_skips_an_item_that_does_not_fit_and_keeps_filling():
    values = np.array([10.0, 9.0, 1.0])
    sizes = np.array([5, 6, 1])
    chosen = greedy_select(values, sizes, 7)
    assert chosen.tolist() == [True, False, True]


def test_ties_are_broken_by_layer_then_expert():
    plan = plan_hot_set(np.ones((2, 3)), 1, 4)
    assert plan.hot_RLE[0].tolist() == [[True, True, True], [True, False, False]]


def test_zero_count_experts_are_never_hot():
    plan = plan_hot_set(np.array([[5.0, 0.0, 0.0]]), 1, 3)
    assert plan.hot_RLE[0].tolist() == [[True, False, False]]
    assert plan.hit_rate == 1.0


def test_exact_hit_rate_and_layer_rates():
    counts = np.array([[6.0, 3.0, 1.0], [0.0, 8.0, 2.0]])
    plan = plan_hot_set(counts, 10, 20)  # two experts fit: 8 and 6
    assert plan.hit_rate == pytest.approx(14 / 20)
    np.testing.assert_allclose(plan.layer_hit_rate_L, [0.6, 0.8])
    assert plan.certified and plan.gap == 0.0


def test_ep_ranks_rank_only_their_own_experts():
    counts = np.array([[10.0, 9.0, 1.0, 2.0]])
    owner = contiguous_owner(1, 4, 2)
    plan = plan_hot_set(counts, 1, 1, rank_of_LE=owner, num_ranks=2)
    assert plan.hot_RLE[0].tolist() == [[True, False, False, False]]
    assert plan.hot_RLE[1].tolist() == [[False, False, False, True]]
    assert plan.hit_rate == pytest.approx(12 / 22)


@pytest.mark.parametrize(
    "counts, error, match",
    [
        ([[1.0, np.nan]], HistogramError, "not finite"),
        ([[1.0, -1.0]], HistogramError, "negative"),
        ([[0.0, 0.0]], HistogramError, "all zero"),
        ([1.0, 2.0], HistogramError, "shape"),
    ],
)
def test_bad_counts_raise_typed_errors(counts, error, match):
    with pytest.raises(error, match=match):
        plan_hot_set(np.array(counts), 1, 10)


def test_negative_budget_and_mismatched_sizes_raise():
    with pytest.raises(PlanError, match="budget"):
        plan_hot_set(np.ones((2, 2)), 1, -1)
    with pytest.raises(PlanError, match="do not match"):
        plan_hot_set(np.ones((2, 2)), np.ones(3, dtype=int), 10)


def test_internal_overflow_raises_instead_of_clipping(monkeypatch):
    import hotsplit_cli.hotset.planner as planner

    monkeypatch.setattr(planner, "greedy_select", lambda v, s, b: np.ones(len(v), dtype=bool))
    with pytest.raises(BudgetOverflowError, match="internal"):
        planner.select(np.array([1.0, 2.0, 3.0]), np.array([1, 1, 1]), 2)


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 100), max_swaps=st.integers(0, 3),
       margin=st.floats(1.0, 3.0))
def test_swap_rule(counts, seed, max_swaps, margin):
    rng = np.random.default_rng(seed)
    hot = rng.random(counts.shape) < 0.5
    swaps = propose_swaps(counts, hot, max_swaps, margin)
    per_layer = np.bincount([s.layer for s in swaps], minlength=counts.shape[0])
    assert per_layer.max(initial=0) <= max_swaps
    for s in swaps:
        assert hot[s.layer, s.out_expert] and not hot[s.layer, s.in_expert]
        assert counts[s.layer, s.in_expert] > margin * counts[s.layer, s.out_expert]
    # Each expert moves at most once per update.
    moved = [(s.layer, s.in_expert) for s in swaps] + [(s.layer, s.out_expert) for s in swaps]
    assert len(moved) == len(set(moved))


def test_swap_rule_respects_the_margin_exactly():
    counts = np.array([[10.0, 8.0]])
    hot = np.array([[False, True]])
    assert propose_swaps(counts, hot, 2, 1.25) == []  # 10 is not > 1.25 * 8
    (s,) = propose_swaps(counts, hot, 2, 1.2)
    assert (s.out_expert, s.in_expert) == (1, 0)
