"""The rank-time model (hotset/ranktime.py) and the time-balanced layout: never slower than the
token-balanced one on the data it was fitted on, and every layout invariant kept."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.hotset.ranktime import TimeModel, balance_time, physical_plan, rank_times
from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts
from hotsplit_cli.placement.evaluate import duplicate_count, trivial_layout

SIZE = 1000  # bytes of one expert


def probs(counts_LE, top_k=2):
    return np.minimum(1.0, top_k * counts_LE / counts_LE.sum(axis=1, keepdims=True))


def test_rank_times_by_hand():
    """One layer, 4 experts on 2 ranks, expert 0 hot: rank 0 reads expert 1, rank 1 experts 2, 3."""
    pi = np.array([[0.5, 0.25, 0.125, 0.125]])
    lay = Placement((0,), 2, np.array([[0, 1, 2, 3]]))
    hot = np.array([[True, False, False, False]])
    t = rank_times(pi, lay, hot, SIZE, 1e-3, batch=2)  # 1 ms per expert read
    q = lambda p: 1 - (1 - p) ** 2  # noqa: E731
    assert np.allclose(t.cold_ms_LR, [[q(0.25), 2 * q(0.125)]])
    assert t.step_ms == max(q(0.25), 2 * q(0.125))
    two = Placement((0,), 2, np.array([[0, 1, 0, 3]]))  # expert 0 on both ranks: half its traffic each
    t = rank_times(pi, two, np.zeros((1, 4), dtype=bool), SIZE, 1e-3, batch=2)
    assert np.allclose(t.cold_ms_LR, [[q(0.25) + q(0.25), q(0.25) + q(0.125)]])


def test_hot_slots_come_from_the_per_rank_plan():
    counts = np.array([[100.0, 1, 1, 50]])
    lay = Placement((0,), 2, np.array([[0, 1, 2, 3]]))
    plan = physical_plan(counts, lay, SIZE, SIZE)  # one expert hot per rank
    assert plan.hot_RLE[0, 0].tolist() == [True, False, False, False]
    assert plan.hot_RLE[1, 0].tolist() == [False, False, False, True]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), ranks=st.sampled_from([2, 4]), redundant=st.sampled_from([0, 4]),
       hot=st.integers(0, 12), batch=st.sampled_from([1, 8, 64]))
def test_time_balanced_is_never_slower_and_keeps_every_invariant(seed, ranks, redundant, hot, batch):
    rng = np.random.default_rng(seed)
    counts = rng.zipf(1.5, size=(3, 16)).clip(max=500).astype(float)
    geo = Geometry(ranks, redundant)
    tok = place_experts(counts[None], range(3), geo)
    model = TimeModel(counts, probs(counts), SIZE, hot * SIZE, 1.0, batch)
    got = balance_time(model, tok, rounds=8)
    assert model.times(got).step_ms <= model.times(tok).step_ms
    assert duplicate_count(got) == 0
    assert (got.logcnt_LE(16) >= 1).all()
    assert (got.logcnt_LE(16) == tok.logcnt_LE(16)).all()  # swaps move replicas, never add or drop one
    assert got.phy2log_LP.shape == tok.phy2log_LP.shape


def test_hierarchical_layouts_keep_each_nodes_experts():
    rng = np.random.default_rng(1)
    counts = rng.zipf(1.3, size=(2, 16)).clip(max=900).astype(float)
    geo = Geometry(4, 0, 2, 4)
    tok = place_experts(counts[None], range(2), geo)
    got = balance_time(TimeModel(counts, probs(counts), SIZE, 2 * SIZE, 1.0, 16), tok)
    half = tok.num_physical // 2
    for li in range(2):
        assert set(tok.phy2log_LP[li, :half]) == set(got.phy2log_LP[li, :half])


def test_a_layout_that_cannot_improve_is_returned_as_it_was():
    counts = np.ones((1, 8))
    lay = trivial_layout(8, (0,), Geometry(2))
    got = balance_time(TimeModel(counts, probs(counts), SIZE, 0, 1.0, 4), lay)
    assert (np.sort(got.phy2log_LP) == np.sort(lay.phy2log_LP)).all()
    assert TimeModel(counts, probs(counts), SIZE, 0, 1.0, 4).times(got).step_ms == \
        TimeModel(counts, probs(counts), SIZE, 0, 1.0, 4).times(lay).step_ms
