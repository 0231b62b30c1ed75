"""Does a run replay the routing its plan was fitted on? (numpy only)

A plan's in-sample hit rate is exact on the histogram it was fitted on and says nothing about
other traffic, so a run's verdict needs to know which it has (hotset/verdict.py `Fit`). Decided
before the run, from what the run will route:
- a trace (synthetic model): its replayed steps counted and compared with the histogram's counts;
  equal is the fitted routing, anything else (a part of it, another capture) is not;
- synthetic skewed traffic, samples drawn from a histogram's shares, or the router on random
  hidden states: never the routing a histogram counted;
- a checkpoint generating from prompts: not known before it generates (`same` None).
An EP plan's placement was fitted on a histogram of its own, judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.jsonio import read_json_doc
from hotsplit_cli.hotset.planfile import PlanFile, find_beside
from hotsplit_cli.hotset.verdict import Fit
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.trace import Replay

UNKNOWN = Fit(None)


@dataclass(frozen=True)
class RunFits:
    """Whether a run replays the routing of the plan's histogram (`hit_rate`) and of its placement's
    (`balancedness`: an EP plan's placement may have been fitted on another histogram)."""

    hit_rate: Fit = UNKNOWN
    balancedness: Fit = UNKNOWN


def run_fits(plan: PlanFile | None, recipe: Recipe, replay: Replay | None) -> RunFits:
    """What a run of `recipe` (replaying `replay`, None: no trace) routes, against the histograms
    `plan` and its placement were fitted on; UNKNOWN where a file names none."""
    if plan is None:
        return RunFits()
    made = plan.histogram or {}
    fits = [_fit(find_beside(plan.path, made["path"], made.get("sha256")) if made else None, recipe, replay)]
    if plan.placement is not None:
        where = Path(plan.placement["path"])
        source = read_json_doc(where, "placement").get("source") or {}
        hist = source.get("histogram")
        fits.append(_fit(find_beside(where, hist, None) if isinstance(hist, str) else None, recipe, replay))
    return RunFits(*fits)


def _fit(hist_path: Path | None, recipe: Recipe, replay: Replay | None) -> Fit:
    """Whether the run routes exactly what the histogram at `hist_path` counted."""
    if hist_path is None or recipe.model.kind == "hf":
        return UNKNOWN
    t = recipe.traffic
    if replay is not None:
        return _trace_fit(hist_path, recipe, replay)
    if t.kind == "synthetic":
        return Fit(False, f"synthetic traffic of skew {t.skew:g}")
    if t.kind == "histogram":
        return Fit(False, f"samples drawn from the shares of histogram {t.path}, not the routing it counted")
    return Fit(False, "the router on random hidden states")


def _trace_fit(hist_path: Path, recipe: Recipe, replay: Replay) -> Fit:
    """The trace's replayed steps counted per (layer, expert) against the histogram's counts."""
    if not hist_path.is_file():  # moved away: nothing to compare with
        return UNKNOWN
    counts_LE = replay.counts_LE(recipe.model.num_experts)
    hist = load_hist(hist_path)
    if counts_LE.shape == hist.counts_LE.shape and np.array_equal(counts_LE, hist.counts_LE):
        return Fit(True, f"trace {replay.path}")
    words = f"trace {replay.path}, {replay.steps} of its {replay.trace.num_steps} steps"
    if counts_LE.shape == hist.counts_LE.shape and np.all(counts_LE <= hist.counts_LE):
        share = counts_LE.sum() / hist.counts_LE.sum()
        return Fit(False, f"{words}: {100 * share:.0f}% of the routed assignments the histogram counted", part=True)
    return Fit(False, f"{words}: routing counts that differ from the histogram's")
