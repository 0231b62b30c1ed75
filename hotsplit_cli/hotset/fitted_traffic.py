"""Does a run replay the routing its plan was fitted on? (numpy only)

A plan's in-sample hit rate is exact on the histogram it was fitted on and says nothing about
other traffic, so a run's verdict needs to know which it has (hotset/verdict.py `Fit`). Decided
before the run, from what the run will route:
- a trace (synthetic model): its replayed steps counted and compared with the histogram's counts;
  equal is the fitted routing, anything else (a part of it, another capture) is not;
- synthetic skewed traffic, samples drawn from a histogram's shares, or the router on random
  hidden states: never the routing a histogram counted;
- a checkpoint generating from prompts: not known before it generates (`same` None).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.planfile import PlanFile, find_beside
from hotsplit_cli.hotset.verdict import Fit
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.trace import Trace, load_replay

UNKNOWN = Fit(None)


def fitted_traffic(plan: PlanFile | None, recipe: Recipe, trace_path: Path | None, steps: int | None) -> Fit:
    """Whether a run of `recipe` (with --trace `trace_path`, --steps `steps`) routes exactly what
    `plan`'s histogram counted; UNKNOWN without a plan that names its histogram, or for a checkpoint."""
    if plan is None or plan.histogram is None or recipe.model.kind == "hf":
        return UNKNOWN
    t = recipe.traffic
    trace_file = trace_path or (t.path if t.kind == "trace" else None)
    if trace_file is not None:
        return _trace_fit(plan, recipe, Path(trace_file), steps)
    if t.kind == "synthetic":
        return Fit(False, f"synthetic traffic of skew {t.skew:g}")
    if t.kind == "histogram":
        return Fit(False, f"samples drawn from the shares of histogram {t.path}, not the routing it counted")
    return Fit(False, "the router on random hidden states")


def _trace_fit(plan: PlanFile, recipe: Recipe, trace_file: Path, steps: int | None) -> Fit:
    """The trace's replayed steps counted per (layer, expert) against the histogram's counts."""
    recorded = plan.histogram
    hist_path = find_beside(plan.path, recorded["path"], recorded.get("sha256"))
    if not hist_path.is_file():  # moved away: nothing to compare with
        return UNKNOWN
    trace, n_steps = load_replay(trace_file, recipe, steps)
    counts_LE = Trace(trace.topk_ids_SLTK[:n_steps], trace.layers).counts_LE(recipe.model.num_experts)
    hist = load_hist(hist_path)
    if counts_LE.shape == hist.counts_LE.shape and np.array_equal(counts_LE, hist.counts_LE):
        return Fit(True, f"trace {trace_file}")
    words = f"trace {trace_file}, {n_steps} of its {trace.num_steps} steps"
    if counts_LE.shape == hist.counts_LE.shape and np.all(counts_LE <= hist.counts_LE):
        share = counts_LE.sum() / hist.counts_LE.sum()
        return Fit(False, f"{words}: {100 * share:.0f}% of the routed assignments the histogram counted")
    return Fit(False, f"{words}: routing counts that differ from the histogram's")
