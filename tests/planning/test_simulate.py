"""Policy lab: accounting by hand, policy properties, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.analysis.simulate import (
    SimConfig,
    equal_split,
    rebatch,
    run_cache,
    run_dynamic,
    run_hindsight,
    simulate,
    summarise,
)
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import Trace, save_trace


def counts_of(ids_SLTK, E):
    return Trace(np.asarray(ids_SLTK), tuple(range(np.shape(ids_SLTK)[1]))).counts_SLE(E)


def cfg(slots, window=2, dyn_steps=2, size=100):
    return SimConfig(size, slots * size, window, dyn_steps, 2, 1.25)


def test_bytes_accounting_by_hand():
    # One layer, 4 experts, expert 0 and 1 hot (2 slots), 100 B per expert.
    # step 0: tokens route to (0, 2) and (2, 3) -> hits 1, distinct cold {2, 3} -> 200 B
    # step 1: (1, 0) and (0, 3)                 -> hits 3, distinct cold {3}    -> 100 B
    ids = [[[[0, 2], [2, 3]]], [[[1, 0], [0, 3]]]]
    c = counts_of(ids, 4)
    hot = np.array([[True, True, False, False]])
    runs = simulate(c, hot, cfg(2), ["static"])
    s = summarise(runs["static"], c.sum(axis=(1, 2)), 100, 2, read_gbps=1.0)
    assert runs["static"].hits_S.tolist() == [1, 3]
    assert runs["static"].cold_experts_S.tolist() == [2, 1]
    assert s.hit_rate == pytest.approx(4 / 8)
    assert s.pcie_bytes_per_step == pytest.approx(150.0)
    assert s.step_ms == pytest.approx(150 / 1e9 * 1e3)
    # LRU with 2 slots, starting empty: step 0 misses 0, 2, 3 (3 cold reads) and keeps the 2 most
    # used (2, then 0 by lower id) -> 2 fills; step 1 hits 0 twice, misses 1 and 3 (2 cold
    # reads): keeps 0 (used twice) and 1 (lower id than 3) -> 1 fill. A filled miss is read
    # cold and copied: (3 + 2 + 2 + 1) x 100 B over 2 steps = 400 B per step.
    lru = run_cache(c, np.array([2]), "lru")
    assert lru.hits_S.tolist() == [0, 2]
    assert lru.copied_experts_S.tolist() == [2, 1]
    assert lru.cold_experts_S.tolist() == [3, 2]
    s = summarise(lru, c.sum(axis=(1, 2)), 100, 2)
    assert (s.zero_copy_bytes_per_step, s.copy_bytes_per_step, s.pcie_bytes_per_step) == (250.0, 150.0, 400.0)


def test_lru_on_a_cyclic_trace_larger_than_the_cache_never_hits():
    E, cap = 5, 4
    ids = np.array([[[[s % E]]] for s in range(40)])  # one token, top-1, experts 0,1,2,3,4,0,...
    lru = run_cache(counts_of(ids, E), np.array([cap]), "lru")
    assert lru.hits_S.sum() == 0
    assert lru.copied_experts_S.sum() == 40  # every step fills, evicting the next one needed
    assert lru.cold_experts_S.sum() == 40  # and reads the expert it missed in place first


def test_lfu_keeps_the_frequent_expert():
    ids = np.array([[[[0], [s % 3 + 1]]] for s in range(30)])  # expert 0 every token, 1..3 cycle
    lfu = run_cache(counts_of(ids, 4), np.array([2]), "lfu")
    assert lfu.hits_S[1:].sum() >= 29  # expert 0 always resident after the first fill


def test_unchanging_hot_set_gives_static_equal_to_oracle():
    rng = np.random.default_rng(0)
    step = rng.integers(0, 16, size=(3, 8, 2))  # the same routing every step
    c = counts_of(np.stack([step] * 12), 16)
    hot = plan_hot_set(c[:4].sum(axis=0), 100, 10 * 100).hot_RLE[0]
    runs = simulate(c, hot, cfg(10, window=4), ["static", "oracle"])
    a = c.sum(axis=(1, 2))
    st_, orc = (summarise(runs[n], a, 100, 4) for n in ("static", "oracle"))
    assert st_.hit_rate == pytest.approx(orc.hit_rate)
    assert st_.pcie_bytes_per_step == pytest.approx(orc.pcie_bytes_per_step)


def test_static_reports_exactly_the_plan_hit_rate():
    tr = synthetic_trace(zipf_shares(3, 16, 1.0, seed=1), (0, 1, 2), steps=40, batch=8, top_k=2, seed=1)
    c = tr.counts_SLE(16)
    plan = plan_hot_set(c.sum(axis=0), 100, 12 * 100)
    runs = simulate(c, plan.hot_RLE[0], cfg(12, window=10), ["static"])
    assert summarise(runs["static"], c.sum(axis=(1, 2)), 100, 10).hit_rate == plan.hit_rate


def test_dynamic_swaps_by_the_rule_worked_by_hand():
    # One layer, one slot (expert 0 hot), windows of 2 steps, 1 swap per window, margin 1.25.
    # Windows: expert 0 busy (5 per step), noise on expert 2 (3 per step), 0, noise, 0.
    c = np.zeros((10, 1, 3))
    c[[0, 1, 4, 5, 8, 9], 0, 0] = 5
    c[[2, 3, 6, 7], 0, 2] = 3
    hot = np.array([[True, False, False]])
    # decay 0.8 (see test_swap_rule_uses_the_score_that_served_the_traffic_better): swaps 0 -> 2
    # after window 1 and back after window 2, then keeps expert 0 through the second noise.
    run = run_dynamic(c, hot, dyn_steps=2, max_swaps=1, margin=1.25, decay=0.8)
    assert run.hits_S.tolist() == [5, 5, 0, 0, 0, 0, 0, 0, 5, 5]
    assert run.copied_experts_S.tolist() == [0, 0, 0, 0, 1, 0, 1, 0, 0, 0]
    assert run.cold_experts_S.tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
    # decay 0 (the last window alone) follows the noise again and misses the last window.
    run = run_dynamic(c, hot, dyn_steps=2, max_swaps=1, margin=1.25, decay=0.0)
    assert run.hits_S.tolist() == [5, 5, 0, 0, 0, 0, 0, 0, 0, 0]
    assert run.copied_experts_S.tolist() == [0, 0, 0, 0, 1, 0, 1, 0, 1, 0]
    # dyn_max_swaps 0 never swaps.
    assert run_dynamic(c, hot, dyn_steps=2, max_swaps=0, margin=1.25).copied_experts_S.sum() == 0


def test_hindsight_is_the_plan_of_the_whole_trace_and_no_static_set_beats_it():
    tr = synthetic_trace(zipf_shares(3, 16, 1.0, seed=3), (0, 1, 2), steps=60, batch=8, top_k=2, drift_every=20,
                         seed=3)
    c = tr.counts_SLE(16)
    a = c.sum(axis=(1, 2))
    plan = plan_hot_set(c.sum(axis=0), 100, 12 * 100)
    runs = simulate(c, plan_hot_set(c[:10].sum(axis=0), 100, 1200).hot_RLE[0], cfg(12, window=10),
                    ["static", "hindsight"])
    best = summarise(runs["hindsight"], a, 100, 10)
    assert best.hit_rate == pytest.approx(plan.hit_rate) and best.copies == 0 and best.hot_slots == 12
    assert best.hit_rate >= summarise(runs["static"], a, 100, 10).hit_rate
    rng = np.random.default_rng(0)
    for _ in range(20):  # any other hot set of 12 experts serves no more
        other = np.zeros((3, 16), dtype=bool)
        other.ravel()[rng.choice(48, 12, replace=False)] = True
        assert (c * other).sum() <= runs["hindsight"].hits_S.sum()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), slots=st.integers(0, 24), more=st.integers(1, 24))
def test_hindsight_a_larger_budget_never_lowers_the_hit_rate_and_relabelling_relabels(seed, slots, more):
    rng = np.random.default_rng(seed)
    c = rng.poisson(rng.gamma(0.5, 3.0, size=(1, 3, 16)), size=(12, 3, 16)).astype(float)
    c[0, 0, 0] += 1  # never all zero
    small = run_hindsight(c, 100, slots * 100)
    large = run_hindsight(c, 100, (slots + more) * 100)
    assert large.hits_S.sum() >= small.hits_S.sum()
    assert small.hot_slots <= slots and large.hot_slots <= slots + more  # the budget holds
    perm = rng.permutation(16)
    renamed = run_hindsight(c[:, :, np.argsort(perm)], 100, slots * 100)
    assert renamed.hits_S.sum() == pytest.approx(small.hits_S.sum())  # ties may pick other ids, same hits


def test_drift_dynamic_beats_static_and_nothing_beats_oracle():
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps=600, batch=16, top_k=4,
                         drift_every=150, seed=0)
    c = tr.counts_SLE(32)
    config = SimConfig(100, 54 * 100, 50, 50, 2, 1.25)
    hot = plan_hot_set(c[:50].sum(axis=0), 100, config.budget_bytes).hot_RLE[0]
    runs = simulate(c, hot, config)
    s = {n: summarise(r, c.sum(axis=(1, 2)), 100, 50) for n, r in runs.items()}
    assert s["dynamic"].hit_rate > s["static"].hit_rate
    assert s["dynamic"].pcie_bytes_per_step < s["static"].pcie_bytes_per_step
    assert s["oracle"].hit_rate >= s["dynamic"].hit_rate
    assert (s["oracle"].window_hit_rate_W >= s["dynamic"].window_hit_rate_W - 1e-12).all()
    assert (s["oracle"].window_hit_rate_W >= s["static"].window_hit_rate_W - 1e-12).all()


def test_equal_split_and_rebatch():
    assert equal_split(10, 4, 8).tolist() == [3, 3, 2, 2]
    ids = np.arange(2 * 3 * 4 * 1).reshape(2, 3, 4, 1)  # [S=2, L=3, T=4, K=1]
    out = rebatch(ids, 8)
    assert out.shape == (1, 3, 8, 1)
    assert out[0, 1, :, 0].tolist() == ids[:, 1, :, 0].ravel().tolist()


# ---- CLI ----


@pytest.fixture
def drift_trace(tmp_path):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps=200, batch=16, top_k=4,
                         drift_every=60, seed=0)
    return save_trace(tmp_path / "trace.npz", tr)


def test_cli_simulate_json_and_plot(cli, drift_trace, tmp_path):
    png = tmp_path / "sim.png"
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--json", "--plot", png)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc["policies"]) == {"static", "dynamic", "lru", "lfu", "oracle", "hindsight"}
    assert doc["knobs"]["dyn_decay"] == 0.8  # the default
    # static and oracle worked out here from the trace's ids with plain numpy: equal expert sizes,
    # so a hot set is the top counts (ties by layer, then expert).
    from hotsplit_cli.traffic.trace import load_trace

    ids = load_trace(drift_trace, 32).topk_ids_SLTK  # [S, L, T, K]
    S, L = ids.shape[:2]
    counts = np.zeros((S, L, 32))
    for s_, layer, e in zip(*np.nonzero(ids >= 0)[:2], ids[ids >= 0], strict=True):
        counts[s_, layer, e] += 1
    one = 3 * 256 * 128 * 2  # recipes/tiny.yaml's bf16 expert
    slots = int(0.01 * 2**30) // one  # its hot_gib

    def top(c_LE):
        hot = np.zeros(c_LE.size, dtype=bool)
        hot[np.argsort(-c_LE.ravel(), kind="stable")[:slots]] = True
        return hot.reshape(c_LE.shape)

    def cold_reads(c_SLE, hot_LE):  # distinct cold experts each step activates
        return int(((c_SLE > 0) & ~hot_LE).sum())

    static = top(counts[:50].sum(axis=0))
    want = doc["policies"]["static"]
    assert want["hit_rate"] == pytest.approx(counts[:, static].sum() / counts.sum(), rel=1e-12)
    assert want["pcie_bytes_per_step"] == pytest.approx(cold_reads(counts, static) * one / S, rel=1e-12)
    hits = reads = copies = 0
    prev = None
    for a in range(0, S, 50):
        hot = top(counts[a:a + 50].sum(axis=0))
        hits += counts[a:a + 50][:, hot].sum()
        reads += cold_reads(counts[a:a + 50], hot)
        copies += 0 if prev is None else int((hot & ~prev).sum())
        prev = hot
    oracle = doc["policies"]["oracle"]
    assert oracle["hit_rate"] == pytest.approx(hits / counts.sum(), rel=1e-12) and oracle["copies"] == copies
    assert oracle["pcie_bytes_per_step"] == pytest.approx((reads + copies) * one / S, rel=1e-12)
    # the oracle bounds every policy whose hot set changes only at window boundaries
    assert oracle["hit_rate"] >= max(doc["policies"]["dynamic"]["hit_rate"], want["hit_rate"])
    assert doc["static"].startswith("fitted on the trace's first window")
    assert doc["window_steps"] == 50  # the recipe's dyn_steps
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_simulate_dyn_decay_zero_is_the_last_window_rule(cli, drift_trace, monkeypatch):
    from hotsplit_cli.analysis import swap_windows as sim  # where the dynamic policy makes its rule

    seen = []
    real = sim.make_swap_rule
    monkeypatch.setattr(sim, "make_swap_rule", lambda *a: seen.append(a) or real(*a))
    monkeypatch.setenv("HOTSPLIT_DYN_DECAY", "0.5")
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--policies", "dynamic", "--dyn-decay", "0",
            "--json")
    assert r.code == 0, r.err
    # The dynamic policy first (the default rule), then the recommendation's candidates: every one
    # at the flag's decay, which beats the environment's.
    assert seen[0][:2] == ("credit", 0.0) and {a[1] for a in seen} == {0.0}
    assert json.loads(r.out)["knobs"]["dyn_decay"] == 0.0


def test_cli_simulate_dyn_rule_and_sigmas_reach_the_rule(cli, drift_trace, monkeypatch):
    from hotsplit_cli.analysis import swap_windows as sim  # where the dynamic policy makes its rule

    seen = []
    real = sim.make_swap_rule
    monkeypatch.setattr(sim, "make_swap_rule", lambda *a: seen.append(a) or real(*a))
    monkeypatch.setenv("HOTSPLIT_DYN_RULE", "credit")
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--policies", "dynamic", "--dyn-rule",
            "breakeven", "--dyn-sigmas", "3", "--dyn-steps", "20", "--json")
    assert r.code == 0, r.err
    assert seen[0] == ("breakeven", 0.8, 20, 3.0)  # the dynamic policy; then the recommendation's candidates
    assert json.loads(r.out)["knobs"]["dyn_rule"] == "breakeven" and json.loads(r.out)["knobs"]["dyn_sigmas"] == 3.0


def test_cli_simulate_refuses_an_unknown_dyn_rule_before_any_work(cli, drift_trace, tmp_path):
    plot = tmp_path / "p.png"
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--dyn-rule", "lfu", "--plot", plot)
    assert r.code == 2 and "--dyn-rule: must be one of credit, breakeven, got 'lfu'" in r.err
    assert not plot.exists()


def test_cli_simulate_fit_and_human(cli, drift_trace, tiny_hist):
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--fit", tiny_hist, "--policies", "static,lru",
            "--dyn-steps", "20")
    assert r.code == 0, r.err
    assert "fitted on" in r.out and "lru" in r.out and "dynamic" not in r.out.split("\n", 3)[-1].split("lru")[0]


@pytest.mark.parametrize("extra, code, msg", [
    (["--policies", "static,mru"], 2, "unknown policy 'mru'"),
    (["--fit", "a.json", "--plan", "b.json"], 2, "--fit and --plan"),
    (["--dyn-steps", "0"], 2, "--dyn-steps: must be >= 1"),
    (["--dyn-decay", "1.5"], 2, "--dyn-decay: must be <= 1, got 1.5"),
    (["--batch", "0"], 2, "--batch"),
    (["--fit", "missing.json"], 1, "no such file"),
])
def test_cli_simulate_errors_write_nothing(cli, drift_trace, tmp_path, extra, code, msg):
    png = tmp_path / "never.png"
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plot", png, *extra)
    assert r.code == code, r.err
    assert msg in r.err and r.err.startswith("error:")
    assert r.out == "" and not png.exists()


def test_cli_simulate_missing_trace(cli, tmp_path):
    r = cli("simulate", "--trace", tmp_path / "none.npz", "--recipe", "tiny")
    assert r.code == 1 and "no such file" in r.err


# ---- --plan: every policy at the plan's budget ----


@pytest.fixture
def small_plan(cli, tiny_hist, tmp_path):
    """A plan at 0.005 GiB (27 experts): half the tiny recipe's own hot_gib of 0.01."""
    path = tmp_path / "plan.json"
    assert cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "-o", path).code == 0
    return path


def test_cli_simulate_plan_gives_every_policy_the_plans_budget(cli, drift_trace, small_plan):
    plan = json.loads(small_plan.read_text())
    slots = plan["ranks"][0]["hot_experts"]
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plan", small_plan, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    budget = doc["budget"]
    assert budget["budget_bytes"] == plan["budget_bytes"] and budget["source"] == "plan"
    assert budget["hot_slots"] == slots == 27
    assert {name: p["hot_slots"] for name, p in doc["policies"].items()} == dict.fromkeys(doc["policies"], slots)
    human = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plan", small_plan).out
    assert f"budget 5.12 MiB per rank (from plan {small_plan}) = 27 hot experts" in human


def test_cli_simulate_plan_accepts_its_own_budget_and_refuses_another(cli, drift_trace, small_plan, tmp_path):
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plan", small_plan, "--hot-gib", "0.005",
            "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["budget"]["hot_slots"] == 27
    png = tmp_path / "never.png"
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plan", small_plan, "--hot-gib", "0.01",
            "--plot", png)
    assert r.code == 2 and r.out == "" and not png.exists()
    assert r.err == (f"error: --hot-gib 0.01 disagrees with the budget of {small_plan} (0.005 GiB); drop "
                     "--hot-gib: a --plan brings its own budget\n")


def test_cli_simulate_columns_have_units_and_budget_its_unit(cli, drift_trace):
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--hot-gib", "0.001")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert "budget 1.02 MiB per rank (from --hot-gib) = 5 hot experts of 0.19 MiB" in lines[1]
    assert lines[2].split() == ["policy", "hit", "rate", "min", "window", "PCIe", "MiB/step", "zero-copy",
                                "MiB/step", "copies"]
def _drawn_axes(monkeypatch):
    """Replace save_png: draw on a real figure and keep its axes for inspection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hotsplit_cli.commands import simulate as simulate_cmd

    drawn = []

    def save_png(path, draw):
        fig, ax = plt.subplots()
        draw(fig, ax)
        drawn.append(ax)
        open(path, "wb").close()

    monkeypatch.setattr(simulate_cmd, "save_png", save_png)
    return drawn


def test_cli_simulate_plot_of_a_single_window_is_one_bar_per_policy(cli, drift_trace, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = _drawn_axes(monkeypatch)
    png = tmp_path / "sim.png"
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--window-steps", "100000", "--plot", png,
            "--policies", "static,lru,oracle")
    assert r.code == 0, r.err
    ax = drawn[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["static", "lru", "oracle"]
    assert len(ax.patches) == 3 and ax.get_ylim() == (0, 110) and not ax.lines
    heights = [p.get_height() for p in ax.patches]
    assert all(0 < h <= 100 for h in heights)
    assert "one bar per policy, not a curve" in r.err


def _plotted_curves(cli, drift_trace, tmp_path, monkeypatch, policies: str):
    """simulate --plot of the drift trace (many windows) with `policies`: its result and axes."""
    pytest.importorskip("matplotlib")
    drawn = _drawn_axes(monkeypatch)
    r = cli("simulate", "--trace", drift_trace, "--recipe", "tiny", "--plot", tmp_path / "sim.png",
            "--policies", policies)
    assert r.code == 0, r.err
    return r, drawn[0]


def test_cli_simulate_plot_of_many_windows_is_a_curve_per_policy(cli, drift_trace, tmp_path, monkeypatch):
    r, ax = _plotted_curves(cli, drift_trace, tmp_path, monkeypatch, "static,lru")
    assert len(ax.lines) == 2 and not ax.patches and all(len(line.get_xdata()) > 1 for line in ax.lines)
    assert "not a curve" not in r.err


def test_cli_simulate_plot_starts_at_zero_and_shows_oracle_over_hindsight(cli, drift_trace, tmp_path, monkeypatch):
    """Was: a y-axis from 15% and the oracle's curve hidden under hindsight's. Hit rates start at
    0; where the two coincide, hindsight is wide and underneath, oracle thin, dashed, on top."""
    _, ax = _plotted_curves(cli, drift_trace, tmp_path, monkeypatch, "static,oracle,hindsight")
    assert ax.get_ylim() == (0, 100)
    lines = {line.get_label().split(":")[0]: line for line in ax.lines}
    oracle, hindsight = lines["oracle"], lines["hindsight"]
    assert (oracle.get_linestyle(), oracle.get_marker()) != (hindsight.get_linestyle(), hindsight.get_marker())
    assert oracle.get_zorder() > hindsight.get_zorder() and oracle.get_linewidth() < hindsight.get_linewidth()
    legend = [t.get_text().split(":")[0] for t in ax.get_legend().get_texts()]
    assert legend == ["static", "oracle", "hindsight"]
