"""Run bookkeeping that is planning-library code (numpy): the job's trace stacked from its ranks'
routing, the slots a rank refills after its map moved, what the run's trace predicts, and the
expert shares a recipe's synthetic or histogram traffic is drawn from."""

import dataclasses

import numpy as np
import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.hotset.ep_figures import EPFigures, judged_figures
from hotsplit_cli.placement.dispatch import contiguous_placement, predict_trace, stack_rank_traces
from hotsplit_cli.placement.rebalance_rule import refill_moves, replay_rebalancing, trace_predictions
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import recipe_shares


def test_ranks_routing_is_stacked_in_rank_order_padded_per_step():
    rank0 = [np.full((2, 3, 1), 1, np.int32), np.full((2, 1, 1), 2, np.int32)]
    rank1 = [np.full((2, 1, 1), 5, np.int32), np.zeros((2, 0, 1), np.int32)]
    out = stack_rank_traces([rank0, rank1])
    assert out.shape == (2, 2, 6, 1) and out.dtype == np.int32
    assert out[0, :, :, 0].tolist() == [[1, 1, 1, 5, -1, -1]] * 2
    assert out[1, :, :, 0].tolist() == [[2, -1, -1, -1, -1, -1]] * 2  # a rank with no tokens: all padding


def test_a_lost_hot_slot_goes_to_the_strongest_expert_held_cold_ties_by_id():
    hot = np.array([[True, True, False, False, False], [True, False, False, False, False]])
    held = np.array([[False, True, True, True, True], [True, True, False, False, False]])
    share = np.array([[9.0, 0.0, 1.0, 3.0, 3.0], [0.0, 5.0, 0.0, 0.0, 0.0]])
    assert refill_moves(hot, held, share) == {0: [(0, 3)]}  # 3 and 4 tie: the lower id; layer 1 kept its slot
    two_lost = np.array([[True, True, False, False, False]])
    assert refill_moves(two_lost, np.array([[False, False, True, False, True]]), np.ones((1, 5))) == {
        0: [(0, 2), (1, 4)]}
    assert refill_moves(two_lost, np.array([[False, False, False, False, False]]), np.ones((1, 5))) == {}


def test_the_trace_predicts_balancedness_and_hit_rates_until_a_rebalance_moves_the_layout():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 8, size=(12, 2, 8, 2))
    placement = contiguous_placement((0, 1), 8, 2)
    hot = rng.random((2, 2, 8)) < 0.5
    static = predict_trace(ids, placement, 8, hot)
    bal, rates = trace_predictions(ids, placement, 8, hot, 0, moved=False)
    assert bal == static.balancedness and np.array_equal(rates, static.hit_rate_R)
    bal, rates = trace_predictions(ids, placement, 8, hot, 4, moved=True)
    assert bal == replay_rebalancing(ids, placement, 8, 4).balancedness and rates is None


def test_a_recipe_histogram_of_another_shape_is_refused_naming_both_shapes(tmp_path):
    r = load_recipe("tiny")
    m = r.model
    path = tmp_path / "h.json"
    save_hist(path, Histogram(m.name, "test", m.top_k, 10, tuple(m.moe_layer_ids), np.ones((m.num_moe_layers, 3))))
    hist_recipe = dataclasses.replace(r, traffic=dataclasses.replace(r.traffic, kind="histogram", path=str(path)))
    with pytest.raises(InputFileError, match=rf"histogram is \[{m.num_moe_layers}, 3\].*has \[{m.num_moe_layers}, "
                                             rf"{m.num_experts}\]"):
        recipe_shares(hist_recipe)
    save_hist(path, Histogram(m.name, "test", m.top_k, 10, tuple(m.moe_layer_ids),
                              np.ones((m.num_moe_layers, m.num_experts))))
    shares, name = recipe_shares(hist_recipe)
    assert shares.shape == (m.num_moe_layers, m.num_experts) and name == f"histogram {path}"
    assert recipe_shares(r)[1] == f"synthetic skew {r.traffic.skew:g}"


def test_the_job_figures_are_judged_without_writing_into_the_reduced_ones():
    reduced = EPFigures(ranks=[{"rank": 0, "swaps": 0}, {"rank": 1, "swaps": 2}], balancedness=0.9,
                        predicted_balancedness=None, bottleneck={}, exchange={"ms_per_layer": 1.0}, placement={})
    placement = contiguous_placement((0, 1), 8, 2)
    moves = [{"skipped": None, "predicted_after": 0.9, "achieved_after": 0.8},
             {"skipped": "kept", "predicted_after": 0.5, "achieved_after": None}]
    got = judged_figures(reduced, placement, moves, {"predicted_bytes_per_layer": 5.0}, (0.95, np.array([0.5, 0.6])))
    assert got.ranks == [{"rank": 0, "swaps": 0, "predicted_hit_rate": 0.5}, {"rank": 1, "swaps": 2}]  # rank 1 swapped
    assert got.predicted_balancedness == 0.95
    assert got.exchange == {"ms_per_layer": 1.0, "predicted_bytes_per_layer": 5.0}
    assert got.placement == {"method": placement.method, "physical_experts": 8, "slots_per_rank": 4}
    assert got.rebalances == moves and got.rebalance_error["count"] == 1
    assert abs(got.rebalance_error["max_abs"] - 0.1) < 1e-12
    assert reduced.ranks[0] == {"rank": 0, "swaps": 0} and reduced.exchange == {"ms_per_layer": 1.0}  # untouched
    plain = judged_figures(reduced, placement, None, {}, None)
    assert plain.rebalances == [] and plain.rebalance_error is None and plain.predicted_balancedness is None
