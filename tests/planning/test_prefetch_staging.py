"""Staging slots replayed on small traces counted by hand, and agreement with simulate's policies."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.analysis.prefetch import StagingConfig, replay_staging
from hotsplit_cli.analysis.simulate import run_dynamic, run_static
from hotsplit_cli.analysis.swap_windows import dynamic_windows
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.traffic.predict import fit_predictor, token_members_NLE
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import Trace

E = 4


def trace_of(*layers):
    """One step of top-1 tokens, one list per MoE layer."""
    return Trace(np.array(layers)[None, :, :, None], tuple(range(len(layers))))


def replay(trace, predictor, hot_LE, cfg):
    counts = trace.counts_SLE(E)
    run = replay_staging(counts, token_members_NLE(trace, E), [(0, 1, hot_LE, 0)], predictor, cfg)
    return run.to_doc(1, counts.sum())


# fit: expert 0 at layer 0 is always followed by 2, expert 1 by 2 or 3 (half each)
COOCCUR = fit_predictor("cooccur", token_members_NLE(trace_of([0, 0, 1, 1], [2, 2, 3, 2]), E))
STEP = trace_of([1, 0], [3, 2])  # token 0 goes 1 -> 3, token 1 goes 0 -> 2


def test_a_candidate_is_staged_when_its_step_probability_pays_for_the_copy():
    hot = np.zeros((2, E), dtype=bool)
    hot[1, 2] = True  # e2 hot: never a candidate
    # candidates {3, 0} (e2 dropped); p(3) = 1 - (1 - 1/2)(1 - 0) = 1/2, p(0) = 0: e3 staged
    d = replay(STEP, COOCCUR, hot, StagingConfig(1, "layer", 2))
    assert (d["prefetched"], d["useful"], d["wasted"], d["staged_hits"]) == (1, 1, 0, 1.0)
    assert (d["cold_reads"], d["hit_rate"], d["pcie_bytes_per_step"]) == (2, 0.5, 3)  # layer 0's two + one copy
    # a copy priced above p(3) is not made; e3 is read cold
    d = replay(STEP, COOCCUR, hot, StagingConfig(1, "layer", 2, copy_price=0.6))
    assert (d["prefetched"], d["cold_reads"], d["hit_rate"]) == (0, 3, 0.25)


def test_a_hot_expert_is_never_staged():
    hot = np.zeros((2, E), dtype=bool)
    hot[1, [2, 3]] = True
    d = replay(STEP, COOCCUR, hot, StagingConfig(4, "layer", 4))
    assert d["prefetched"] == 0  # only e0 and e1 are cold, and nothing predicts them


def test_a_shared_pool_lends_a_layer_only_the_slots_the_layer_before_left():
    frequent = fit_predictor("frequent", token_members_NLE(trace_of(*[[0, 0, 1, 1]] * 3), E))
    step, hot = trace_of(*[[0, 1]] * 3), np.zeros((3, E), dtype=bool)
    # p(0) = p(1) = 3/4 at layers 1 and 2; one slot takes e0 (ties by id)
    assert replay(step, frequent, hot, StagingConfig(1, "layer", 2))["useful"] == 2
    assert replay(step, frequent, hot, StagingConfig(1, "shared", 2))["useful"] == 1  # layer 1 holds it
    assert replay(step, frequent, hot, StagingConfig(2, "shared", 2))["useful"] == 2  # e0, e1, then none free
    assert StagingConfig(2, "layer", 1).carved_slots(3) == 4 and StagingConfig(2, "shared", 1).carved_slots(3) == 2


@pytest.fixture(scope="module")
def synthetic():
    trace = synthetic_trace(zipf_shares(3, 16, 1.1, seed=1), (0, 1, 2), steps=24, batch=4, top_k=2,
                            drift_every=8, seed=2)
    hot = np.zeros((3, 16), dtype=bool)
    hot[:, :4] = True
    return trace, trace.counts_SLE(16), token_members_NLE(trace, 16), hot


def test_without_slots_the_counts_are_simulates_static_and_dynamic(synthetic):
    trace, counts, members, hot = synthetic
    predictor = fit_predictor("cooccur", members)
    static = replay_staging(counts, members, [(0, 24, hot, 0)], predictor, StagingConfig(0, "layer", 4))
    ref = run_static(counts, hot)
    np.testing.assert_array_equal(static.hits_S, ref.hits_S)
    np.testing.assert_array_equal(static.cold_S, ref.cold_experts_S)
    windows = dynamic_windows(counts, hot, 4, 2, 1.0, rule="breakeven", sigmas=0.0)
    dynamic = replay_staging(counts, members, windows, predictor, StagingConfig(0, "layer", 4))
    ref = run_dynamic(counts, hot, 4, 2, 1.0, rule="breakeven", sigmas=0.0)
    assert ref.copied_experts_S.sum() > 0  # the case swaps
    for got, want in [(dynamic.hits_S, ref.hits_S), (dynamic.cold_S, ref.cold_experts_S),
                      (dynamic.copied_S, ref.copied_experts_S)]:
        np.testing.assert_array_equal(got, want)


def test_staging_turns_cold_reads_into_staged_hits_one_for_one(synthetic):
    trace, counts, members, hot = synthetic
    predictor = fit_predictor("cooccur", members)
    windows = list(dynamic_windows(counts, hot, 4, 2, 1.0, rule="breakeven", sigmas=0.0))
    off = replay_staging(counts, members, windows, predictor, StagingConfig(0, "layer", 4))
    on = replay_staging(counts, members, windows, predictor, StagingConfig(2, "layer", 4))
    assert on.useful_S.sum() > 0 and (on.prefetched_S <= 2 * 2).all()  # 2 slots x 2 predicted layers
    np.testing.assert_array_equal(on.cold_S, off.cold_S - on.useful_S)
    np.testing.assert_allclose(on.hits_S, off.hits_S + on.staged_hits_S)


def test_bad_staging_is_refused():
    with pytest.raises(PlanError, match="pool='ring'"):
        StagingConfig(1, "ring", 4)
    with pytest.raises(PlanError, match="bad staging: slots=-1"):
        StagingConfig(-1, "layer", 4)


def test_one_admission_rule_prices_swaps_and_prefetches():
    from hotsplit_cli.hotset.admission import BreakEvenRule, copy_pays

    assert copy_pays(0.5, 0.4) and not copy_pays(0.5, 0.5)  # a prefetch: reads saved against its priced copy
    assert copy_pays(1.01) and not copy_pays(1.0)  # a swap's copy costs one read
    rule = BreakEvenRule(decay=0.5, window_steps=1, sigmas=0.0)  # horizon 2 steps; scores over 1 step
    rule.steps = 1.0
    assert rule.pays(10.0, 0.0, 1.0) == copy_pays(2 * (1 - np.exp(-10.0)))  # 2 x 0.99995 > 1
    assert not rule.pays(0.5, 0.0, 1.0)  # 2 x (1 - e^-0.5) = 0.79 reads saved: less than the copy
