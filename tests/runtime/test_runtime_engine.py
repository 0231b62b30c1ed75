"""The engine: dynamic vs static, the swap rule and its limits, planner failures, traces, hit rates."""

import dataclasses

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import PlanError, RuntimeFailure
from hotsplit_cli.hotset.planner import Swap, plan_hot_set, propose_swaps
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import Trace, save_trace
from tests.conftest import interrupt_at

torch.set_num_threads(1)


def tiny(**traffic):
    r = load_recipe("tiny")
    return dataclasses.replace(r, traffic=dataclasses.replace(r.traffic, **traffic),
                               run=dataclasses.replace(r.run, scale=0.25))


def knobs(r, **env):
    return resolve_knobs(r.knobs, {f"HOTSPLIT_{k.upper()}": str(v) for k, v in env.items()})


def test_dynamic_beats_static_on_a_drifting_stream():
    r = tiny(drift_every=60, batch=8)
    rates = {}
    for dynamic in (0, 1):
        p = prepare_run(r, knobs(r, dynamic=dynamic, dyn_steps=20, dyn_max_swaps=4), steps=240)
        rates[dynamic] = p.engine.run(p.steps).hit_rate
    assert rates[1] > rates[0] + 0.05, rates


def test_static_mode_never_swaps():
    r = tiny(drift_every=20)
    p = prepare_run(r, knobs(r, dynamic=0, dyn_steps=10), steps=60)
    s = p.engine.run(p.steps)
    assert s.swaps == 0 and len(s.records) == 6 and all(rec.swaps == 0 for rec in s.records)


@pytest.mark.parametrize("seed", range(20))
def test_swap_rule_respects_margin_and_limit(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, size=(3, 12)).astype(float)
    hot = rng.random((3, 12)) < 0.4
    margin, limit = 1.0 + rng.random() * 2, int(rng.integers(0, 4))
    swaps = propose_swaps(counts, hot, limit, margin)
    for layer in range(3):
        assert sum(s.layer == layer for s in swaps) <= limit
    for s in swaps:
        assert s.in_count > margin * s.out_count
        assert hot[s.layer, s.out_expert] and not hot[s.layer, s.in_expert]


def test_no_swap_when_incoming_is_within_margin():
    counts = np.array([[10.0, 12.0, 0.0, 0.0]])
    hot = np.array([[True, False, False, False]])
    assert propose_swaps(counts, hot, 2, 1.25) == []  # 12 <= 1.25 * 10
    assert len(propose_swaps(counts, hot, 2, 1.1)) == 1


def test_engine_swaps_per_layer_never_exceed_the_knob():
    r = tiny(drift_every=15)
    p = prepare_run(r, knobs(r, dyn_steps=5, dyn_max_swaps=1, dyn_margin=1.0), steps=60)
    seen = []

    def spy(counts, hot, max_swaps, margin):
        swaps = propose_swaps(counts, hot, max_swaps, margin)
        seen.append(swaps)
        return swaps

    p.engine.book.propose = spy
    p.engine.run(p.steps)
    assert any(seen)
    for swaps in seen:
        layers = [s.layer for s in swaps]
        assert all(layers.count(li) <= 1 for li in layers)


def test_engine_rejects_a_proposal_over_the_limit_as_a_planner_failure():
    r = tiny()
    p = prepare_run(r, knobs(r, dyn_steps=5, dyn_max_swaps=1), steps=10)
    hot = p.engine.model.hot_LE()
    out_e, in_e = np.flatnonzero(hot[0])[:2], np.flatnonzero(~hot[0])[:2]
    p.engine.book.propose = lambda *a: [Swap(0, int(o), int(i), 9.0, 1.0) for o, i in zip(out_e, in_e, strict=True)]
    s = p.engine.run(p.steps)
    assert s.swaps == 0 and "dyn_max_swaps" in s.records[0].planner_error


def test_three_planner_failures_in_a_row_abort():
    r = tiny()
    p = prepare_run(r, knobs(r, dyn_steps=2), steps=20)

    def broken(*a):
        raise PlanError("live counts must be finite and >= 0")

    p.engine.book.propose = broken
    with pytest.raises(RuntimeFailure, match="3 updates in a row at step 6"):
        p.engine.run(p.steps)


def test_a_success_resets_the_failure_count():
    r = tiny()
    p = prepare_run(r, knobs(r, dyn_steps=2), steps=20)
    calls = iter([False, False, True, False, False, True, False, False, True, True])

    def flaky(*a):
        if not next(calls):
            raise PlanError("transient")
        return []

    p.engine.book.propose = flaky
    s = p.engine.run(p.steps)
    assert s.steps == 20 and sum(rec.planner_error is not None for rec in s.records) == 6


def test_ctrl_c_stops_with_the_summary_so_far():
    r = tiny()
    p = prepare_run(r, knobs(r, dyn_steps=10), steps=100)
    interrupt_at(p.engine, 25)
    s = p.engine.run(p.steps)
    assert s.interrupted and s.steps == 25 and [rec.step for rec in s.records] == [10, 20, 25]


def test_trace_with_static_plan_hits_exactly_the_plans_rate(tmp_path):
    r = tiny()
    m = r.model
    trace = synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.3, 4), m.moe_layer_ids, 40, 8, m.top_k,
                            drift_every=13, seed=2)
    ids = trace.topk_ids_SLTK.copy()
    ids[::3, :, 0, -1] = -1  # padding is not an assignment
    path = tmp_path / "t.npz"
    save_trace(path, Trace(ids, trace.layers))
    p = prepare_run(r, knobs(r, dynamic=0, dyn_steps=7), trace_path=path)
    s = p.engine.run(p.steps)
    counts = Trace(ids, trace.layers).counts_LE(m.num_experts)
    plan = plan_hot_set(counts, expert_bytes_per_rank(r), p.plan.budget_bytes)
    assert s.steps == 40
    assert s.hit_rate == plan.hit_rate == (counts * p.plan.hot_LE).sum() / counts.sum()


def test_synthetic_hit_rate_matches_the_plan_within_sampling_error():
    r = tiny(drift_every=0, batch=32)
    p = prepare_run(r, knobs(r, dynamic=0, dyn_steps=50), steps=150)
    s = p.engine.run(p.steps)
    expected = p.plan.expected_hit_rate
    tokens = s.steps * r.traffic.batch * r.model.num_moe_layers
    sigma = np.sqrt(expected * (1 - expected) / tokens)  # per-token inclusions: conservative
    assert abs(s.hit_rate - expected) < 4 * sigma, (s.hit_rate, expected, sigma)


def test_router_source_runs_and_counts_every_assignment():
    r = load_recipe("tiny")
    r = dataclasses.replace(r, traffic=dataclasses.replace(r.traffic, kind="prompts", path=r.path),
                            run=dataclasses.replace(r.run, scale=0.25))
    p = prepare_run(r, knobs(r, dyn_steps=5), steps=10)
    model = p.engine.model
    seen = []  # per layer call: how many assignments, how many served by a hot expert
    inner = model.compute

    def spy(x_TH, ids_TK, w_TK, bank, counts_E=None):
        ids = ids_TK.reshape(-1).cpu().numpy()
        ids = ids[ids >= 0]
        seen.append((len(ids), int(bank.served_hot_E[ids].sum())))
        return inner(x_TH, ids_TK, w_TK, bank, counts_E)

    model.compute = spy
    s = p.engine.run(p.steps)
    assert p.engine.source.name == "router" and s.tokens == 10 * r.traffic.batch
    assigned, hits = np.sum(seen, axis=0)
    assert len(seen) == 10 * r.model.num_moe_layers
    assert assigned == s.tokens * r.model.top_k * r.model.num_moe_layers
    assert 0 < hits < assigned and s.hit_rate == pytest.approx(hits / assigned, rel=1e-12)


@pytest.mark.parametrize("rule, decay", [("credit", 0.0), ("credit", 0.8), ("breakeven", 0.8)])
def test_dynamic_run_on_a_trace_equals_simulate_exactly(tmp_path, rule, decay):
    """The runtime and `simulate` share one swap rule: same swaps, same hits, window by window."""
    from hotsplit_cli.analysis.simulate import run_dynamic

    r = tiny()
    m = r.model
    trace = synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 5), m.moe_layer_ids, 60, 8, m.top_k,
                            drift_every=15, seed=5)
    path = save_trace(tmp_path / "t.npz", trace)
    p = prepare_run(r, knobs(r, dyn_steps=5, dyn_max_swaps=2, dyn_margin=1.25, dyn_decay=decay, dyn_rule=rule,
                             dyn_sigmas=1), trace_path=path)
    hot0 = p.engine.model.hot_LE().copy()
    s = p.engine.run(p.steps)
    c = trace.counts_SLE(m.num_experts)
    sim = run_dynamic(c, hot0, dyn_steps=5, max_swaps=2, margin=1.25, decay=decay, rule=rule, sigmas=1.0)
    # The last window ends the run: no swap there, whose copies no step would use (nor in simulate).
    assert [rec.swaps for rec in s.records] == sim.copied_experts_S[5::5].tolist() + [0]
    assert s.swaps == sim.copied_experts_S.sum() > 0 and s.bytes_copied == s.swaps * p.expert_bytes
    a = c.sum(axis=(1, 2))
    sim_windows = [sim.hits_S[i:i + 5].sum() / a[i:i + 5].sum() for i in range(0, 60, 5)]
    assert [rec.hit_rate_window for rec in s.records] == pytest.approx(sim_windows, abs=1e-12)
    assert s.hit_rate == pytest.approx(sim.hits_S.sum() / a.sum(), abs=1e-12)
