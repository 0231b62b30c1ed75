"""The one rule for the hot budget and the cold read rate (hotsplit_cli/hotset/budget.py), reached
without the CLI, and the commands and the runtime agreeing on it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import GIB, load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.budget import choose_read_rate, resolve_hot_budget
from hotsplit_cli.hotset.planfile import PlanFile
from hotsplit_cli.hotset.sizes import dense_bytes_per_rank

MIB = 1 << 20


def write_platform(path, gpus, copy_gbps=None):
    """A platform.json with the given GPUs: (free bytes, zero-copy GB/s, h2d GB/s) each."""
    path.write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
        "host": {"numa_nodes": [], "copy_gbps": copy_gbps},
        "gpus": [{"index": i, "mem_free_bytes": free, "summary": {"zero_copy_read_gbps": zc, "h2d_gbps": h2d}}
                 for i, (free, zc, h2d) in enumerate(gpus)]}))
    return path


@pytest.fixture
def tiny():
    return load_recipe("tiny")  # hotsplit.hot_gib 0.01, hardware.gpu_mem_gib 0.5, bank 24 MiB


def auto(recipe, env=None):
    """Knobs with the budget left to the rule (HOTSPLIT_HOT_GIB empty = auto)."""
    return resolve_knobs(recipe.knobs, {"HOTSPLIT_HOT_GIB": "", **(env or {})})


def test_the_knob_precedence_and_a_plans_budget(tiny, tmp_path):
    plan = PlanFile(tmp_path / "p.json", (1,), ({1: (0,)},), None, None, budget_bytes=123_456)
    b = resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}))
    assert (b.origin, b.source, b.hot_gib, b.budget_bytes) == ("recipe hotsplit.hot_gib", "recipe", 0.01,
                                                               int(0.01 * GIB))
    assert resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}, {"hot_gib": "0.02"})).origin == "--hot-gib"
    b = resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}), plan=plan)
    assert (b.budget_bytes, b.source, b.origin) == (123_456, "plan", f"plan {plan.path}")  # beats the recipe's
    with pytest.raises(UsageError, match="HOTSPLIT_HOT_GIB 0.5 disagrees with the budget"):  # asked for: not ignored
        resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {"HOTSPLIT_HOT_GIB": "0.5"}), plan=plan)
    unrecorded = PlanFile(tmp_path / "p.json", (1,), ({1: (0,)},), None, None, None)
    with pytest.raises(UsageError, match="records no `budget_bytes`"):
        resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}), plan=unrecorded)
    b = resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}, {"hot_gib": "0.02"}), plan=unrecorded)
    assert b.budget_bytes == int(0.02 * GIB) and b.source == "flag"
    with pytest.raises(UsageError, match="disagrees with the budget"):
        resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}, {"hot_gib": "0.02"}), plan=plan)


def test_derived_from_the_probed_free_memory_else_the_recipe(tiny, tmp_path):
    dense_gib = dense_bytes_per_rank(tiny) / GIB
    b = resolve_hot_budget(tiny, auto(tiny))  # 0.5 GiB GPU: the whole 24 MiB bank fits
    assert (b.source, b.origin, b.budget_bytes) == ("auto", "auto", 24 * MIB)
    assert b.derivation.gpu_mem_source == "recipe hardware.gpu_mem_gib" and b.explain().endswith("(capped at the "
                                                                                                  "full bank)")
    # The smallest free memory of the GPUs: 20 MiB, less the dense weights, under the bank.
    path = write_platform(tmp_path / "p.json", [(40 * MIB, None, None), (20 * MIB, None, None)])
    b = resolve_hot_budget(tiny, auto(tiny), load_platform(path))
    assert b.budget_bytes == int((20 * MIB / GIB - dense_gib) * GIB)
    assert b.derivation.gpu_mem_source == f"{path}: smallest free GPU memory" and b.over_gpu is None


def test_a_platform_without_gpu_derives_from_the_recipes_hardware_and_says_so(tiny, tmp_path):
    """A probe of a CPU-only machine still gives rates: the budget then comes from the recipe."""
    cpu_only = load_platform(write_platform(tmp_path / "cpu.json", [], copy_gbps=10.0))
    b = resolve_hot_budget(tiny, auto(tiny), cpu_only)
    assert b.budget_bytes == resolve_hot_budget(tiny, auto(tiny)).budget_bytes
    assert b.derivation.gpu_mem_source == (f"recipe hardware.gpu_mem_gib: {tmp_path / 'cpu.json'} has no GPU with "
                                           "a measured free memory")
    assert f"{tmp_path / 'cpu.json'} has no GPU" in b.explain()
    assert resolve_hot_budget(tiny, resolve_knobs(tiny.knobs, {}), cpu_only).budget_bytes == int(0.01 * GIB)


def test_a_given_budget_over_the_gpu_says_why(tiny, tmp_path):
    knobs = resolve_knobs(tiny.knobs, {}, {"hot_gib": "0.3"})
    assert resolve_hot_budget(tiny, knobs).over_gpu is None  # fits the recipe's 0.5 GiB
    small = load_platform(write_platform(tmp_path / "p.json", [(1 << 28, None, None)]))
    why = resolve_hot_budget(tiny, knobs, small).over_gpu
    assert why.startswith("hot budget 0.30 GiB + dense") and why.endswith(
        f"exceeds GPU memory 0.25 GiB ({small.path}: smallest free GPU memory)")


def test_the_read_rate_slowest_zero_copy_else_host_copy_else_the_recipe(tiny, tmp_path):
    two = load_platform(write_platform(tmp_path / "a.json", [(None, 25.0, 26.0), (None, 21.0, 24.0)], 12.5))
    r = choose_read_rate(tiny, two)
    assert (r.gbps, r.source, r.h2d_gbps, r.zero_copy_gbps) == (21.0, "slowest GPU's zero-copy read", 24.0, 21.0)
    unmeasured = load_platform(write_platform(tmp_path / "b.json", [(None, None, 22.0)], 12.5))
    r = choose_read_rate(tiny, unmeasured)
    assert (r.gbps, r.source, r.zero_copy_gbps) == (12.5, "host memory copy (no GPU measured)", None)
    assert choose_read_rate(tiny, None).gbps is None  # tiny states no pcie_gbps
    stated = replace(tiny, hardware=replace(tiny.hardware, pcie_gbps=25.0))
    assert choose_read_rate(stated, None).source == "recipe hardware.pcie_gbps, not measured"
    assert choose_read_rate(stated, unmeasured).gbps == 12.5  # a platform.json beats the recipe


def test_plan_simulate_and_run_derive_the_same_budget_from_a_platform(cli, tiny_hist, tmp_path, monkeypatch):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "")
    platform = write_platform(tmp_path / "p.json", [(20 * MIB, 20.0, 20.0)])
    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4),
                                                           steps=8, batch=4, top_k=4, seed=0))
    want = int((20 * MIB / GIB - dense_bytes_per_rank(load_recipe("tiny")) / GIB) * GIB)
    plan = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", platform, "--json")
    sim = cli("simulate", "--trace", trace, "--recipe", "tiny", "--platform", platform, "--json")
    run = cli("run", "tiny", "--trace", trace, "--steps", "2", "--platform", platform, "--json")
    assert plan.code == sim.code == run.code == 0, plan.err + sim.err + run.err
    assert json.loads(plan.out)["budget_bytes"] == want
    assert json.loads(sim.out)["budget"]["budget_bytes"] == want
    assert json.loads(run.out)["plan"]["budget_bytes"] == want


def test_plan_and_simulate_read_cold_experts_at_the_same_rate(cli, tiny_hist, tmp_path):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4),
                                                           steps=8, batch=4, top_k=4, seed=0))
    cpu_only = write_platform(tmp_path / "cpu.json", [], copy_gbps=12.5)
    plan = json.loads(cli("plan", tiny_hist, "--recipe", "tiny", "--platform", cpu_only, "--json").out)
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--platform", cpu_only, "--json")
    assert r.code == 0 and r.err == "", r.err
    sim = json.loads(r.out)
    want = {"gbps": 12.5, "source": "host memory copy (no GPU measured)"}
    assert plan["decode_cost_read_gbps"] == sim["read_rate"] == want
    static = sim["policies"]["static"]  # no copies: all its time is cold reads at 12.5 GB/s
    assert static["step_ms"] == pytest.approx(static["zero_copy_bytes_per_step"] / 12.5e9 * 1e3)
    human = cli("simulate", "--trace", trace, "--recipe", "tiny", "--platform", cpu_only).out
    assert "step ms = cold bytes at 12.5 GB/s (host memory copy (no GPU measured)); no copy rate" in human
