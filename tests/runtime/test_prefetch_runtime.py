"""Staging slots in the runtime (runtime/prefetch.py): the counters equal `simulate`'s staging
replay exactly, outputs are those of a run without prefetch, the pool is carved from the hot
budget, and what a step stages is never hot and never outlives the step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hotsplit_runtime import from_recipe, hot_set
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.analysis.simulate import SimRequest, run_simulation
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.traffic.hist import save_hist
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import Trace, save_trace
from tests.conftest import make_hist

torch.set_num_threads(1)
COUNTERS = ("prefetched", "useful", "wasted", "staged_hits", "copies", "cold_reads", "hit_rate", "staged_hit_rate",
            "useful_bytes_per_step", "wasted_bytes_per_step", "pcie_bytes_per_step")


def tiny():
    r = load_recipe("tiny")
    return dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25))


def knobs(r, **env):
    return resolve_knobs(r.knobs, {f"HOTSPLIT_{k.upper()}": str(v) for k, v in env.items()})


@pytest.fixture
def trace_path(tmp_path):
    """A drifting synthetic trace of tiny (4 MoE layers of 32 experts, top-4), some padding."""
    m = tiny().model
    tr = synthetic_trace(zipf_shares(m.num_moe_layers, m.num_experts, 1.2, 5), m.moe_layer_ids, 32, 8, m.top_k,
                         drift_every=12, seed=4)
    ids = tr.topk_ids_SLTK.copy()
    ids[::5, :, 0, -1] = -1  # padding is no assignment and no token to predict from
    return save_trace(tmp_path / "t.npz", Trace(ids, tr.layers))


def _simulated(tmp_path, r, k, trace_path, fit=None) -> dict:
    """simulate's dynamic staging row, its static hot set fitted on the trace's own counts (what
    a run without a plan plans on)."""
    with np.load(trace_path) as z:
        tr = Trace(z["topk_ids"], tuple(int(x) for x in z["layers"]))
    hist = tmp_path / "fit.hist.json"
    save_hist(hist, make_hist(tr.counts_LE(r.model.num_experts), tr.layers, r.model.top_k, "tiny"))
    sim = run_simulation(SimRequest(trace_path, ("dynamic",), fit_path=hist, prefetch_fit_path=fit), r, k)
    return sim.staging


@pytest.mark.parametrize("pool, slots", [("shared", 3), ("layer", 2), ("shared", 0)])
def test_runtime_staging_counters_equal_simulate(tmp_path, trace_path, pool, slots):
    r = tiny()
    k = knobs(r, prefetch="trace", prefetch_pool=pool, prefetch_slots=slots, prefetch_guesses=6, dyn_steps=8,
              dyn_max_swaps=2, dyn_margin=1.0, hot_gib=0.0035)
    staging = _simulated(tmp_path, r, k, trace_path)
    p = prepare_run(r, k, trace_path=trace_path)
    s = p.engine.run(p.steps)
    assert int(p.plan.hot_LE.sum()) == staging.hot_slots  # the pool carved from the same budget
    sim = staging.rows["dynamic"]
    for key in COUNTERS:
        assert s.prefetch[key] == pytest.approx(sim[key], rel=1e-12, abs=0), key
    assert s.hit_rate == pytest.approx(sim["hit_rate"], rel=1e-12)
    assert s.swaps == sim["copies"] > 0
    # What the plan predicts is the hot experts' share: staged hits do not count against it.
    assert s.hot_hit_rate == pytest.approx(sim["hit_rate"] - sim["staged_hit_rate"], rel=1e-12)
    assert s.expected_gap == pytest.approx(s.hot_hit_rate - s.expected_hit_rate, rel=1e-12)
    assert (sim["prefetched"] > sim["useful"] > 0) == (slots > 0)
    windows = [rec.prefetch for rec in s.records]
    assert sum(w["prefetched"] for w in windows) == sim["prefetched"]
    assert sum(w["staged_hits"] for w in windows) == sim["staged_hits"]


def _outputs(r, k, trace_path) -> tuple[list[torch.Tensor], object]:
    p = prepare_run(r, k, trace_path=trace_path)
    outs = []
    for routed in p.engine.source.steps():
        p.engine.step(routed)
        outs.append(p.engine.out_TH.clone())
        if p.engine.step_count % k.dyn_steps == 0:
            p.engine.close_window(update=True)
    return outs, p


def test_outputs_with_staging_equal_outputs_without(trace_path):
    r = tiny()
    base = dict(dyn_steps=8, dyn_max_swaps=2, dyn_margin=1.0, hot_gib=0.0035)
    off, p_off = _outputs(r, knobs(r, prefetch="off", **base), trace_path)
    on, p_on = _outputs(r, knobs(r, prefetch="trace", prefetch_slots=4, **base), trace_path)
    assert len(on) == len(off) == 32
    assert_same_outputs_nothing_left_staged(off, on, p_off, p_on, 4)


def assert_same_outputs_nothing_left_staged(off: list, on: list, p_off, p_on, shared_slots: int) -> None:
    """Every step's output equal, the shared slots carved from the hot set, staged experts read
    (counters not yet closed included), and no bank holding a staged expert after its step."""
    for a, b in zip(on, off, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert p_on.plan.hot_LE.sum() == p_off.plan.hot_LE.sum() - shared_slots
    assert p_on.engine.stager._total[2] + p_on.engine.stager._window[2] > 0
    for bank in p_on.engine.model.banks:
        assert bank.staged == [] and np.array_equal(bank.served_E, bank.table.expert2slot_E)


def test_a_staged_expert_is_never_hot_and_its_rows_hold_its_weights(trace_path):
    r = tiny()
    k = knobs(r, prefetch="trace", prefetch_pool="layer", prefetch_slots=3, dynamic=0)
    p = prepare_run(r, k, trace_path=trace_path)
    model, seen = p.engine.model, []
    real_unstage = model.unstage

    def check_then_unstage():
        for bank in model.banks:
            rows = range(bank.table.num_slots, bank.table.num_slots + len(bank.staged))
            for e, row in zip(bank.staged, rows, strict=True):
                assert not bank.table.hot_E[e] and bank.served_E[e] == row
                assert torch.equal(bank.hot_SB[row], bank.cold_EB[e])
            seen.append(len(bank.staged))
        real_unstage()
    model.unstage = check_then_unstage
    p.engine.run(p.steps)
    assert max(seen) == 3 and len(model.banks[0].staged) == 0
    assert model.banks[0].staging_rows == 0 and all(b.staging_rows == 3 for b in model.banks[1:])


def test_a_plan_that_fills_the_budget_leaves_no_room_for_the_pool(tmp_path, trace_path, cli, monkeypatch):
    r = tiny()
    plan = tmp_path / "plan.json"
    with np.load(trace_path) as z:
        tr = Trace(z["topk_ids"], tuple(int(x) for x in z["layers"]))
    hist = tmp_path / "h.json"
    save_hist(hist, make_hist(tr.counts_LE(32), tr.layers, 4, "tiny"))
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.0035", "-o", plan).code == 0
    reads = []
    real = from_recipe.load_plan
    for module in (from_recipe, hot_set):  # where a build would read it
        monkeypatch.setattr(module, "load_plan", lambda path: reads.append(path) or real(path))
    with pytest.raises(PlanError, match="fills the budget the staging slots are carved from"):
        prepare_run(r, knobs(r, prefetch="trace"), plan_path=plan, trace_path=trace_path)
    assert reads == [plan]  # read once, for the hot set and for this check
