"""The live-rebalancing rule: a map moves only when a map fitted on earlier counts beats it on
later counts it did not see, by more than their noise. On stationary traffic that never ends
below not rebalancing at all; from a poor start or on drifting traffic it still helps."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.placement.algorithm import Geometry, place_experts
from hotsplit_cli.placement.dispatch import contiguous_placement
from hotsplit_cli.placement.rebalance_rule import (
    REBALANCE_MARGIN,
    chunk_ends,
    decide_rebalance,
    move_margin,
    replay_rebalancing,
    split_chunks,
)
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares

L, E, K, LAYERS = 4, 32, 4, (1, 2, 3, 4)


def counts_LE(ids_SLTK: np.ndarray) -> np.ndarray:
    return np.stack([np.bincount(ids_SLTK[:, li].reshape(-1), minlength=E) for li in range(L)]).astype(float)


def replayed(ids, start, eplb):
    return replay_rebalancing(ids, start, E, eplb).balancedness


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eplb", [1, 8])
def test_on_stationary_traffic_rebalancing_never_ends_below_keeping_the_map(seed, eplb):
    shares = zipf_shares(L, E, 1.1, seed)
    fit = synthetic_trace(shares, LAYERS, 24, 64, K, seed=100 + seed).topk_ids_SLTK
    run = synthetic_trace(shares, LAYERS, 96, 64, K, seed=200 + seed).topk_ids_SLTK
    start = place_experts(counts_LE(fit)[None], LAYERS, Geometry(4, 4))  # place, as the README does
    assert replayed(run, start, eplb) >= replayed(run, start, 0)


@pytest.mark.parametrize("eplb", [1, 8])
def test_from_a_poor_start_it_still_moves_and_helps(eplb):
    run = synthetic_trace(zipf_shares(L, E, 1.1, 0), LAYERS, 96, 64, K, seed=7).topk_ids_SLTK
    start = contiguous_placement(LAYERS, E, 4)
    rep = replay_rebalancing(run, start, E, eplb)
    assert any(d.placement is not None for _, d in rep.decisions)
    assert rep.balancedness > replayed(run, start, 0) + 0.1


def test_on_drifting_traffic_it_follows_the_drift():
    """Fitted on one popularity, served another (the experts' ranks permuted): the map moves."""
    fit = synthetic_trace(zipf_shares(L, E, 1.1, 1), LAYERS, 24, 64, K, seed=1).topk_ids_SLTK
    run = synthetic_trace(zipf_shares(L, E, 1.1, 2), LAYERS, 96, 64, K, seed=2).topk_ids_SLTK
    start = place_experts(counts_LE(fit)[None], LAYERS, Geometry(4, 4))
    assert replayed(run, start, 32) > replayed(run, start, 0) + 0.02


def test_a_candidate_is_judged_on_counts_it_did_not_see():
    """Fit counts that favour a new map, judge counts that do not: the map is kept, and the
    reason gives both held-out scores."""
    start = contiguous_placement(LAYERS, E, 4)
    skewed = np.ones((L, E))
    skewed[:, :8] = 50  # all of rank 0's experts hot in the fit half
    even = np.full((L, E), 20.0)
    d = decide_rebalance(skewed, even, start, live=0.5)
    assert d.placement is None and "on unseen counts" in d.kept
    assert d.current_held_out == pytest.approx(1.0) and d.candidate_held_out <= 1.0
    moved = decide_rebalance(skewed, skewed, start, live=0.5)  # the latest counts agree: it moves
    assert moved.placement is not None and moved.candidate_held_out > moved.current_held_out + REBALANCE_MARGIN


def test_nothing_to_judge_on_keeps_the_map_and_a_high_balance_is_not_looked_at():
    start = contiguous_placement(LAYERS, E, 4)
    some = np.ones((L, E))
    assert decide_rebalance(np.zeros((L, E)), some, start, 0.5).kept == "no counts yet to judge a new map on"
    assert decide_rebalance(np.zeros((L, E)), np.zeros((L, E)), start, 0.5).kept == "no traffic"
    assert decide_rebalance(some, some, start, 0.97).kept.startswith("balancedness 0.970 >=")


def test_the_margin_is_the_noise_of_few_counts_and_the_floor_of_many():
    assert move_margin(np.full((4, 8), 4.0), 4) == pytest.approx(1.5 / np.sqrt(8))
    assert move_margin(np.full((4, 8), 1e6), 4) == REBALANCE_MARGIN


def test_chunks_are_half_intervals_and_the_judge_is_the_latest_half():
    assert chunk_ends(1) == (1,) and chunk_ends(8) == (4, 8) and chunk_ends(5) == (2, 5)
    a, b, c = (np.full((1, 2), float(x)) for x in (1, 2, 4))
    fit, judge = split_chunks([a, b, c])
    assert fit.tolist() == [[1.0, 1.0]] and judge.tolist() == [[6.0, 6.0]]
    fit, judge = split_chunks([a])
    assert not fit.any() and judge.tolist() == [[1.0, 1.0]]
