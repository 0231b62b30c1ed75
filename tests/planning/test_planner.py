import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hotsplit_cli.core.errors import BudgetOverflowError, HistogramError, PlanError
from hotsplit_cli.hotset.planner import (
    SwapRule,
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


def best_swaps_by_brute_force(c_E, hot_E, max_swaps, margin):
    """Every set of at most `max_swaps` disjoint (out, in) pairs with in > margin * out, by
    enumeration: the largest total gain sum(in - out) and the (outs, ins) sets that reach it."""
    pairs = [(o, i) for o in np.flatnonzero(hot_E) for i in np.flatnonzero(~hot_E) if c_E[i] > margin * c_E[o]]
    best, sets = 0.0, {(frozenset(), frozenset())}
    for k in range(1, max_swaps + 1):
        for combo in itertools.combinations(pairs, k):
            outs, ins = {o for o, _ in combo}, {i for _, i in combo}
            if len(outs) < k or len(ins) < k:
                continue  # an expert in two pairs
            gain = float(sum(c_E[i] - c_E[o] for o, i in combo))
            if gain > best + 1e-9:
                best, sets = gain, set()
            if gain >= best - 1e-9:
                sets.add((frozenset(outs), frozenset(ins)))
    return best, sets


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 1000), max_swaps=st.integers(0, 3),
       margin=st.sampled_from([1.0, 1.1, 1.25, 2.0]))
def test_swap_rule_gives_exactly_the_best_swaps_of_brute_force(counts, seed, max_swaps, margin):
    hot = np.random.default_rng(seed).random(counts.shape) < 0.5
    swaps = propose_swaps(counts, hot, max_swaps, margin)
    for layer in range(counts.shape[0]):
        mine = [s for s in swaps if s.layer == layer]
        best, sets = best_swaps_by_brute_force(counts[layer], hot[layer], max_swaps, margin)
        assert sum(s.in_count - s.out_count for s in mine) == pytest.approx(best)
        outs, ins = frozenset(s.out_expert for s in mine), frozenset(s.in_expert for s in mine)
        assert (outs, ins) in sets
        if len(sets) == 1:  # a unique best: the exact pairs' experts
            assert {(outs, ins)} == sets
        for s in mine:  # every pair is itself within the margin, with its own counts
            assert s.in_count == counts[layer, s.in_expert] and s.out_count == counts[layer, s.out_expert]
            assert s.in_count > margin * s.out_count


def test_swap_rule_pairs_across_the_margin_as_well_as_possible():
    # Strongest cold 10, 3; weakest hot 1, 2.5. Pairing 10-1 and 3-2.5 fails the margin at the
    # second pair (3 <= 1.25 * 2.5), but 10-2.5 and 3-1 both pass: two swaps, gain 9.5.
    counts = np.array([[1.0, 2.5, 7.0, 10.0, 3.0]])
    hot = np.array([[True, True, True, False, False]])
    swaps = propose_swaps(counts, hot, 2, 1.25)
    assert sorted((s.out_expert, s.in_expert) for s in swaps) == [(0, 4), (1, 3)]
    # A pair that no longer gains is left out, even within the margin of its partner.
    counts = np.array([[1.0, 50.0, 100.0, 2.0]])
    hot = np.array([[True, True, False, False]])
    assert [(s.out_expert, s.in_expert) for s in propose_swaps(counts, hot, 2, 1.25)] == [(0, 2)]


def test_swap_rule_uses_the_score_that_served_the_traffic_better():
    # One slot, expert 0 hot. Windows: expert 0 busy, one noisy window on expert 2, expert 0
    # again, noise again. The window-only rule (decay 0) chases the noise every time.
    windows = [[10.0, 0, 0], [0, 0, 6], [10, 0, 0], [0, 0, 6]]
    for decay, expected in ((0.8, [[], [(0, 2)], [(2, 0)], []]), (0.0, [[], [(0, 2)], [(2, 0)], [(0, 2)]])):
        rule, hot, got = SwapRule(decay), np.array([[True, False, False]]), []
        for w in windows:
            swaps = rule(np.array([w]), hot, 1, 1.25)
            got.append([(s.out_expert, s.in_expert) for s in swaps])
            for s in swaps:
                hot[0, s.out_expert], hot[0, s.in_expert] = False, True
        assert got == expected, decay
    # decay 0.8 by hand: window 3's 10 assignments go to expert 0, the top of the decayed score
    # [8, 0, 6] but not of the last window [0, 0, 6]: credit 10 to the decayed score, 0 to the last
    # window. Window 4 (noise) then scores [0.8 * 16.4, 0, 0.8 * 4.8 + 6] = [13.12, 0, 9.84]:
    # 9.84 <= 1.25 * 13.12, no swap.
    assert rule.credit_2L.tolist() == [[0.0], [0.0]]  # decay 0: both scores are the last window
    rule = SwapRule(0.8)
    for w, h in zip(windows, ([True, False, False], [True, False, False], [False, False, True],
                              [True, False, False]), strict=True):
        rule(np.array([w]), np.array([h]), 1, 1.25)
    assert rule.credit_2L.tolist() == [[0.0], [10.0]]
    assert rule.score_LE == pytest.approx(np.array([[13.12, 0.0, 9.84]]))


def test_swap_rule_follows_the_last_window_where_it_predicts_better():
    # A hotspot that moves to expert 1 and stays: the last window's top (1) serves window 3,
    # the decayed score's top (0, from 0.8 * 10 > 6) does not.
    rule = SwapRule(0.8)
    for w, h in (([10.0, 0, 0], [True, False, False]), ([0, 6, 0], [True, False, False]),
                 ([0, 6, 0], [False, True, False])):
        swaps = rule(np.array([w]), np.array([h]), 1, 1.25)
    assert swaps == [] and rule.credit_2L.tolist() == [[6.0], [0.0]]
    assert rule.score_LE.tolist() == [[0.0, 6.0, 0.0]]


def test_swap_rule_refuses_bad_input_and_keeps_its_score():
    rule = SwapRule(0.8)
    hot = np.array([[True, False]])
    rule(np.array([[1.0, 2.0]]), hot, 1, 1.25)
    with pytest.raises(PlanError, match="must match"):
        rule(np.array([[1.0, 2.0]]), np.array([[True, False, False]]), 1, 1.25)
    with pytest.raises(PlanError, match="finite"):
        rule(np.array([[np.nan, 2.0]]), hot, 1, 1.25)
    with pytest.raises(PlanError, match="do not match"):
        rule(np.ones((2, 2)), np.ones((2, 2), dtype=bool), 1, 1.25)
    assert rule.score_LE.tolist() == [[1.0, 2.0]] and rule.credit_2L.tolist() == [[0.0], [0.0]]
    with pytest.raises(PlanError, match="decay"):
        SwapRule(1.5)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), decay=st.sampled_from([0.0, 0.5, 0.8, 1.0]), max_swaps=st.integers(0, 3))
def test_swap_rule_keeps_the_budget_and_permuting_experts_permutes_its_swaps(seed, decay, max_swaps):
    rng = np.random.default_rng(seed)
    L, E = 3, 8
    windows = rng.permutation(6 * L * E).reshape(6, L, E).astype(float) * rng.random((6, L, E))  # no ties
    hot0 = np.zeros((L, E), dtype=bool)
    hot0[:, :3] = True
    perm = rng.permutation(E)  # new id of old expert e is perm[e]
    inv = np.argsort(perm)
    a, b = SwapRule(decay), SwapRule(decay)
    hot_a, hot_b = hot0.copy(), hot0[:, inv].copy()
    for w in windows:
        sa, sb = a(w, hot_a, max_swaps, 1.25), b(w[:, inv], hot_b, max_swaps, 1.25)
        assert sorted((s.layer, int(perm[s.out_expert]), int(perm[s.in_expert])) for s in sa) == sorted(
            (s.layer, s.out_expert, s.in_expert) for s in sb)
        for hot, swaps in ((hot_a, sa), (hot_b, sb)):
            for s in swaps:
                hot[s.layer, s.out_expert], hot[s.layer, s.in_expert] = False, True
        assert (hot_a.sum(axis=1) == 3).all()  # every layer keeps its slots: the budget holds
