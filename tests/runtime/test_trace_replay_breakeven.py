"""The runtime replays a shared ESFT trace in the recommended break-even mode exactly as `simulate`
does: the same hit rate, swaps and bytes copied (deepseek-v2-lite at scale 1/64 on the CPU, a plan fitted
on another task). Skipped when the shared routing records are not beside the checkout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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
