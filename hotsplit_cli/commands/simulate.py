"""`hotsplit simulate --trace T --recipe R`: replay a routing trace under static / dynamic /
LRU / LFU / oracle / hindsight policies with the same byte budget; hit rates and PCIe bytes per step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from hotsplit_cli.analysis.recommend import recommend_for
from hotsplit_cli.analysis.simulate import LAYER_SPLIT, SimRequest, policies_for, run_simulation, stored_counts
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.options import (
    HotGibOpt,
    JsonOpt,
    PlatformOpt,
    PlotOpt,
    PrecisionOpt,
    PrefetchGuessesOpt,
    PrefetchOpt,
    PrefetchPoolOpt,
    PrefetchSlotsOpt,
    RequiredRecipeOpt,
    knob_option,
)
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.plotting import integer_step_ticks, save_png

if TYPE_CHECKING:
    from hotsplit_cli.analysis.recommend import Recommendation
    from hotsplit_cli.analysis.simulate import SimResult


def simulate_cmd(
    trace: Annotated[Path, typer.Option("--trace", help="Routing trace (.npz from `balance --trace`).")],
    recipe: RequiredRecipeOpt,
    hot_gib: HotGibOpt = None,
    precision: PrecisionOpt = None,
    fit: Annotated[Path | None, typer.Option("--fit", show_default="the trace's first window",
                                                  help="Fit the static plan on this histogram.")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", show_default="fitted (--fit)",
                                                   help="Use this plan.json as the static hot set.")] = None,
    policies: Annotated[str | None, typer.Option(
        "--policies", metavar="LIST", show_default="all; static,dynamic at precision auto",
        help="Comma-separated policies to run.")] = None,
    batch: Annotated[int | None, typer.Option("--batch", show_default="the trace's steps",
                                                         help="Regroup the trace's tokens into steps of B.")] = None,
    window_steps: Annotated[int | None, typer.Option(
        "--window-steps", show_default="dyn_steps", help="Steps per reporting and oracle window.")] = None,
    dyn_steps: Annotated[str | None, knob_option("dyn_steps")] = None,
    dyn_max_swaps: Annotated[str | None, knob_option("dyn_max_swaps")] = None,
    dyn_margin: Annotated[str | None, knob_option("dyn_margin")] = None,
    dyn_decay: Annotated[str | None, knob_option("dyn_decay")] = None,
    dyn_rule: Annotated[str | None, knob_option("dyn_rule")] = None,
    dyn_sigmas: Annotated[str | None, knob_option("dyn_sigmas")] = None,
    prefetch: PrefetchOpt = None, prefetch_slots: PrefetchSlotsOpt = None, prefetch_pool: PrefetchPoolOpt = None,
    prefetch_guesses: PrefetchGuessesOpt = None,
    prefetch_fit: Annotated[Path | None, typer.Option(
        "--prefetch-fit", show_default="the replayed trace's first window",
        help="Fit the prefetch predictor on this trace.")] = None,
    platform: PlatformOpt = None,
    plot: PlotOpt = None,
    json: JsonOpt = False,
) -> None:
    """Replay a routing trace under hot-set policies and compare hit rate and PCIe bytes per step."""
    out = Output(json)
    policies_for(policies, "native")  # a bad list is refused before the recipe is read
    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib, "dyn_steps": dyn_steps,
                                                   "dyn_max_swaps": dyn_max_swaps, "dyn_margin": dyn_margin,
                                                   "dyn_decay": dyn_decay, "dyn_rule": dyn_rule,
                                                   "dyn_sigmas": dyn_sigmas, "precision": precision,
                                                   "prefetch": prefetch,
                                                   "prefetch_slots": prefetch_slots, "prefetch_pool": prefetch_pool,
                                                   "prefetch_guesses": prefetch_guesses})
    req = SimRequest(trace, policies_for(policies, knobs.precision), fit, plan, batch, window_steps, platform,
                     prefetch_fit)
    result = run_simulation(req, rec, knobs, out.warn, out.progress)
    advice = recommend_for(result, recipe, out.progress)
    doc = {**result.to_doc(), "recommendation": advice.to_doc() if advice else None}
    if plot is not None:
        _plot(out, plot, result)
    out.emit(doc, lambda: (_render(out, result), _render_staging(out, result),
                           _render_advice(out, advice) if advice else None))
    if plot is not None:
        out.note(f"wrote {plot}")


def _plot(out: Output, plot: Path, result: SimResult) -> None:
    cfg, sums = result.config, result.sums
    title = f"{result.recipe}: {gib(cfg.budget_bytes)} hot, {cfg.hot_slots} slots"
    save_png(plot, lambda fig, ax: draw_policies(ax, sums, cfg.window_steps, title))
    if len(next(iter(sums.values())).window_hit_rate_W) == 1:
        out.note(f"note: the trace is one window of {cfg.window_steps} steps, so {plot} shows one bar per policy, "
                 "not a curve; pass --window-steps below that for hit rate over steps")


def _render(out: Output, result: SimResult) -> None:
    """The human report of a `SimResult`."""
    tr, cfg, k, rate = result.trace, result.config, result.knobs, result.rate
    out.print(f"trace {result.request.trace_path}: {tr.num_steps} steps x {tr.topk_ids_SLTK.shape[2]} tokens x "
              f"top-{tr.top_k}, {len(tr.layers)} layers x {result.num_experts} experts")
    if cfg.stored is None:
        experts = f"{cfg.hot_slots} hot experts of {cfg.expert_bytes / (1 << 20):.2f} MiB"
    else:
        counts = stored_counts(cfg.stored, result.static_hot_LE)
        experts = f"{cfg.hot_slots} hot experts at the plan's precisions (" + ", ".join(
            f"{p} {n['hot']} hot / {n['cold']} cold" for p, n in counts.items()) + "; swaps keep each one's)"
    out.print(f"budget {gib(cfg.budget_bytes)} per rank (from {result.budget.origin}) = {experts}; "
              f"static {result.static_source}; windows of "
              f"{cfg.window_steps} steps; dyn_steps={k.dyn_steps} dyn_max_swaps={k.dyn_max_swaps} "
              f"dyn_margin={k.dyn_margin:g} dyn_decay={k.dyn_decay:g} dyn_rule={k.dyn_rule}"
              + (f" dyn_sigmas={k.dyn_sigmas:g}" if k.dyn_rule == "breakeven" else ""))
    if rate.gbps:
        copies = (f" + copied bytes at {rate.h2d_gbps:.1f} GB/s (slowest GPU's host->device copy)" if rate.h2d_gbps
                  else "; no copy rate: a policy that copies gets none")
        out.print(f"step ms = cold bytes at {rate.gbps:.1f} GB/s ({rate.source}){copies}")
    cols = ["policy", "hit rate", "min window", "PCIe MiB/step", "zero-copy MiB/step", "copies"]
    if rate.gbps:
        cols.insert(4, "step ms")
    t = out.table(*cols)
    for n, s in result.sums.items():
        row = [n, pct(s.hit_rate, 2), pct(float(s.window_hit_rate_W.min()), 1),
               f"{s.pcie_bytes_per_step / (1 << 20):.2f}", f"{s.zero_copy_bytes_per_step / (1 << 20):.2f}",
               str(s.copies)]
        if rate.gbps:
            row.insert(4, "-" if s.step_ms is None else f"{s.step_ms:.3f}")
        t.add_row(*row)
    out.print(t)
    for n in result.sums:
        out.print(f"  {n}: {LAYER_SPLIT[n]}")
    c = result.cold_paths
    if c is not None:
        def ms(x):
            return "-" if x is None else f"{x:.3f} ms"

        others = [m for m in c["tied"] if m != c["fastest"]]
        tie = f" ({' and '.join(others)} within the spread: a tie)" if others else ""
        out.print(f"cold time per step of the static hot set by cold path ({c['rates']}): gpu {ms(c['gpu_ms'])}, "
                  f"cpu {ms(c['cpu_ms'])}, split {ms(c['split_ms'])} (CPU share {100 * c['split_cpu_share']:.0f}%)"
                  f"; fastest here: {c['fastest'] or '-'}{tie}")


def _render_staging(out: Output, result: SimResult) -> None:
    """The rows with staging slots (knob prefetch on)."""
    st = result.staging
    if st is None:
        return
    c, r = st.config, st.recall
    out.print(f"prefetch: co-activation table fitted on {st.fit_source}; {c.slots} staging slots "
              f"{'per layer' if c.pool == 'layer' else 'shared by all layers'}, {c.guesses} guesses per token; "
              f"{st.hot_slots} hot experts left; guesses cover {pct(r['covered'], 1)} of cold reads "
              f"({r['useful']} useful and {r['wasted']} wasted token guesses)")
    t = out.table("policy + staging", "hit rate", "prefetched", "useful", "wasted", "staged hits",
                  "useful MiB/step", "wasted MiB/step", "PCIe MiB/step")
    for n, d in st.rows.items():
        t.add_row(n, pct(d["hit_rate"], 2), str(d["prefetched"]), str(d["useful"]), str(d["wasted"]),
                  f"{d['staged_hits']:g}", *(f"{d[k] / (1 << 20):.2f}" for k in (
                      "useful_bytes_per_step", "wasted_bytes_per_step", "pcie_bytes_per_step")))
    out.print(t)
    h = st.held_out
    out.print(f"prefetch: per-token recall at {c.guesses} guesses on held-out windows " + (
        f"{pct(h['expected'], 1)}, range {pct(h['low'], 1)}-{pct(h['high'], 1)} ({h['method']})" if h["available"]
        else f"not estimated: {h['reason']}"))


# One look per policy. oracle and hindsight often draw the same curve: hindsight wide and pale
# underneath, oracle thin, dashed and on top, so that both show where they coincide.
POLICY_STYLES = {
    "static": {"marker": "o", "markersize": 3, "linestyle": "-"},
    "dynamic": {"marker": "s", "markersize": 3, "linestyle": "-"},
    "lru": {"marker": "v", "markersize": 3, "linestyle": "-."},
    "lfu": {"marker": "^", "markersize": 3, "linestyle": "-."},
    "hindsight": {"marker": "D", "markersize": 5, "linestyle": "-", "linewidth": 4, "alpha": 0.4, "zorder": 2},
    "oracle": {"marker": "x", "markersize": 5, "linestyle": "--", "linewidth": 1.2, "zorder": 3},
}


def _render_advice(out: Output, advice: Recommendation) -> None:
    """The recommendation: what to run, what it achieved here, and the command."""
    b = advice.best
    what = (f"dynamic, dyn_rule {b.dyn_rule}, dyn_steps {b.dyn_steps}, dyn_max_swaps {b.dyn_max_swaps}" if b.dynamic
            else "static (no swaps)")
    out.print(f"recommended for this trace: {what}: hit rate {pct(b.hit_rate, 2)}, "
              f"{b.pcie_bytes_per_step / (1 << 20):.2f} PCIe MiB/step, {b.copies} copies (the lowest bytes per step of "
              f"{len(advice.candidates)} runnable candidates, ties by hit rate)")
    out.print(f"run it: {advice.command}")
    if advice.note:
        out.print(f"  note: {advice.note}")


def draw_policies(ax, sums: dict, wsteps: int, title: str) -> None:
    """Hit rate per window for each policy (`sums`: name -> PolicySummary); with a single window
    there is no curve to draw, so one bar per policy."""
    def label(n, s) -> str:
        return f"{n}: {100 * s.hit_rate:.1f}%, {s.pcie_bytes_per_step / (1 << 20):.1f} MiB/step"

    windows = len(next(iter(sums.values())).window_hit_rate_W)
    if windows == 1:
        names = list(sums)
        bars = ax.bar(names, [100 * s.hit_rate for s in sums.values()], color=[f"C{i}" for i in range(len(names))])
        ax.bar_label(bars, labels=[f"{100 * s.hit_rate:.1f}%\n{s.pcie_bytes_per_step / (1 << 20):.1f} MiB/step"
                                   for s in sums.values()], fontsize=8)
        ax.set_xlabel(f"policy (one window: steps 0..{wsteps - 1})")
        ax.set_ylabel("hit rate (%)")
        ax.set_ylim(0, 110)
    else:
        x = np.arange(windows) * wsteps
        for n, s in sums.items():
            ax.plot(x, 100 * s.window_hit_rate_W, label=label(n, s), **POLICY_STYLES.get(n, {"marker": "."}))
        integer_step_ticks(ax, x)
        ax.set_xlabel(f"step (windows of {wsteps})")
        ax.set_ylabel("hit rate per window (%)")
        ax.set_ylim(0, 100)  # from 0, as every hit-rate axis: a small gap must not look like a large one
        ax.legend(fontsize=8)
    ax.set_title(f"{title}; PCIe MiB/step {'on the bars' if windows == 1 else 'in legend'}")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
