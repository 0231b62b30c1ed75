"""The runtime replays a shared ESFT trace in the recommended break-even mode exactly as `simulate`
does: the same hit rate, swaps and bytes copied (deepseek-v2-lite at scale 1/64 on the CPU, a plan fitted
on another task). Skipped when the shared routing records are not beside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.analysis.simulate import SimRequest, run_simulation
from hotsplit_cli.cli import main
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.hist import Histogram, save_hist

ROOT = Path(__file__).resolve().parents[2]
ROUTING = next((p / "shared" / "data" / "routing" for p in ROOT.parents[:2] if (p / "shared").is_dir()),
               ROOT.parent / "shared" / "data" / "routing")
RECOMMENDED = {"HOTSPLIT_DYN_RULE": "breakeven", "HOTSPLIT_DYN_STEPS": "8", "HOTSPLIT_DYN_MAX_SWAPS": "16",
               "HOTSPLIT_DYNAMIC": "1"}
HOT_GIB = "6.703125"  # 416 experts of 16.5 MiB
torch.set_num_threads(1)  # as a run on the CPU sets it (runtime/device.py tune_cpu_threads)


def _trace(task: str) -> Path:
    path = ROUTING / f"esft-v2lite-{task}.trace.npz"
    if not path.is_file():
        pytest.skip(f"shared routing data not found: {path}")
    return path


def _plan(tmp_path: Path, task: str) -> Path:
    """A plan fitted on the whole of one task's trace, 416 experts hot."""
    with np.load(_trace(task)) as z:
        ids, layers = z["topk_ids"], z["layers"]
    counts = np.stack([np.bincount(ids[:, i].ravel(), minlength=64) for i in range(ids.shape[1])]).astype(float)
    hist = tmp_path / f"{task}.hist.json"
    save_hist(hist, Histogram("deepseek-ai/DeepSeek-V2-Lite", f"ESFT {task}", 6, int(ids.shape[0] * ids.shape[2]),
                              tuple(int(x) for x in layers), counts))
    plan = tmp_path / f"{task}.plan.json"
    assert main(["plan", str(hist), "--recipe", "deepseek-v2-lite", "--hot-gib", HOT_GIB, "-o", str(plan)]) == 0
    return plan


@pytest.mark.parametrize("fit, replay", [("intent", "law"), ("law", "intent")])  # 260 and 256 (= 32 x 8) steps
def test_breakeven_run_on_an_esft_trace_equals_simulate_exactly(tmp_path, fit, replay):
    trace, plan = _trace(replay), _plan(tmp_path, fit)
    recipe = load_recipe("deepseek-v2-lite")
    knobs = resolve_knobs(recipe.knobs, RECOMMENDED)
    sim = run_simulation(SimRequest(trace, ("dynamic",), plan_path=plan), recipe, knobs).sums["dynamic"]
    p = prepare_run(recipe, knobs, plan_path=plan, trace_path=trace, scale=1 / 64)  # plans keep real bytes
    s = p.engine.run(p.steps)
    assert s.steps == p.steps == len(np.load(trace)["topk_ids"])
    assert s.swaps == sim.copies > 100  # the task switch is followed
    assert s.bytes_copied == sim.copies * p.expert_bytes == round(sim.copy_bytes_per_step * s.steps)
    assert s.hit_rate == pytest.approx(sim.hit_rate, abs=1e-12)
    assert s.cold_bytes_per_step == pytest.approx(sim.zero_copy_bytes_per_step, rel=1e-12)


STAGING_STEPS = 64  # 8 windows of the law trace: swaps, staging and copies all at work, in seconds


def test_staging_on_the_esft_law_trace_equals_simulate_exactly(tmp_path):
    """Staging with the co-activation table fitted on intent, replaying law with dynamic break-even
    swaps: the runtime's prefetched, useful, wasted, staged hits and PCIe bytes are `simulate`'s."""
    law, intent = _trace("law"), _trace("intent")
    with np.load(law) as z:
        ids, layers = z["topk_ids"][:STAGING_STEPS], z["layers"]
    head = tmp_path / "law-head.trace.npz"
    np.savez(head, topk_ids=ids, layers=layers)
    counts = np.stack([np.bincount(ids[:, i].ravel(), minlength=64) for i in range(ids.shape[1])]).astype(float)
    hist = tmp_path / "law-head.hist.json"  # what a run without a plan plans on: the replayed counts
    save_hist(hist, Histogram("deepseek-ai/DeepSeek-V2-Lite", "ESFT law", 6, int(ids.shape[0] * ids.shape[2]),
                              tuple(int(x) for x in layers), counts))
    recipe = load_recipe("deepseek-v2-lite")
    knobs = resolve_knobs(recipe.knobs, {**RECOMMENDED, "HOTSPLIT_HOT_GIB": HOT_GIB, "HOTSPLIT_PREFETCH": "trace"})
    staging = run_simulation(SimRequest(head, ("dynamic",), fit_path=hist, prefetch_fit_path=intent),
                             recipe, knobs).staging
    sim = staging.rows["dynamic"]
    p = prepare_run(recipe, knobs, trace_path=law, steps=STAGING_STEPS, scale=1 / 64, prefetch_fit=intent)
    s = p.engine.run(p.steps)
    assert s.steps == STAGING_STEPS and int(p.plan.hot_LE.sum()) == staging.hot_slots == 412  # 4 shared slots carved
    got = s.prefetch
    for key in ("prefetched", "useful", "wasted", "staged_hits", "copies", "cold_reads"):
        assert got[key] == sim[key], key
    assert got["pcie_bytes_per_step"] == pytest.approx(sim["pcie_bytes_per_step"], rel=1e-12)
    assert s.hit_rate == pytest.approx(sim["hit_rate"], rel=1e-12)
    assert sim["useful"] > 1000 and sim["wasted"] > 0 and sim["copies"] > 0


def law_head_and_intent_hist(folder: Path, quality=None) -> tuple[Path, Path]:
    """The law trace's first STAGING_STEPS steps, and the intent trace's histogram (with
    `quality(counts)`, its measured-errors block, when given)."""
    with np.load(_trace("law")) as z:
        head = folder / "law-head.trace.npz"
        np.savez(head, topk_ids=z["topk_ids"][:STAGING_STEPS], layers=z["layers"])
    with np.load(_trace("intent")) as z:
        ids, layers = z["topk_ids"], z["layers"]
    counts = np.stack([np.bincount(ids[:, i].ravel(), minlength=64) for i in range(ids.shape[1])]).astype(float)
    hist = folder / "intent.hist.json"
    save_hist(hist, Histogram("deepseek-ai/DeepSeek-V2-Lite", "ESFT intent", 6, int(ids.shape[0] * ids.shape[2]),
                              tuple(int(x) for x in layers), counts))
    if quality is not None:
        doc = json.loads(hist.read_text())
        doc["quality"] = quality(counts)
        hist.write_text(json.dumps(doc))
    return head, hist


@pytest.mark.parametrize("precision", ["fp8", "mxfp4"])
def test_a_run_at_a_stored_precision_reports_simulates_hit_rate_and_cold_bytes(tmp_path, precision):
    """The issue's table, run: a static plan fitted on intent at 4 GiB of experts stored at the
    precision, law replayed (its first 64 steps, at scale 1/64): the runtime's hit rate and cold
    bytes per step are `simulate`'s, both counting the stored bytes."""
    head, hist = law_head_and_intent_hist(tmp_path)
    plan = tmp_path / "intent.plan.json"
    assert main(["plan", str(hist), "--recipe", "deepseek-v2-lite", "--hot-gib", "4", "--precision", precision,
                 "-o", str(plan)]) == 0
    recipe = load_recipe("deepseek-v2-lite")
    knobs = resolve_knobs(recipe.knobs, {"HOTSPLIT_PRECISION": precision, "HOTSPLIT_DYNAMIC": "0"})
    sim = run_simulation(SimRequest(head, ("static",), plan_path=plan), recipe, knobs).sums["static"]
    p = prepare_run(recipe, knobs, plan_path=plan, trace_path=head, scale=1 / 64)
    s = p.engine.run(p.steps)
    assert s.steps == STAGING_STEPS and s.swaps == 0
    assert s.hit_rate == pytest.approx(sim.hit_rate, abs=1e-12)
    assert s.cold_bytes_per_step == pytest.approx(sim.zero_copy_bytes_per_step, rel=1e-12)
    native = load_recipe("deepseek-v2-lite").model
    assert p.expert_bytes < 3 * native.hidden_size * native.moe_intermediate_size * 2 / 1.9  # stored, not bf16
