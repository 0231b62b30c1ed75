"""`hotsplit simulate --trace T --recipe R`: replay a routing trace under static / dynamic /
LRU / LFU / oracle policies with the same byte budget; hit rates and PCIe bytes per step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ..errors import HotsplitError, PlanError, UsageError
from ..options import HotGibOpt, JsonOpt, PlatformOpt, PlotOpt, RecipeOpt
from ..output import Output, gib, pct


def _policies(text: str) -> tuple[str, ...]:
    from ..simulate import POLICIES

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in POLICIES]
    if bad or not names:
        raise UsageError(f"--policies: unknown policy {bad[0] if bad else '(none)'!r}",
                         f"choose from {','.join(POLICIES)}")
    return tuple(dict.fromkeys(names))


def _platform_rates(path: Path, out: Output) -> tuple[float | None, float | None]:
    try:
        from ..platform_file import load_platform
    except ModuleNotFoundError as exc:
        if exc.name != "hotsplit_cli.platform_file":
            raise
        raise HotsplitError("this hotsplit cannot read platform files yet", "drop --platform") from None
    plat = load_platform(path)
    reads = [g.zero_copy_read_gbps for g in plat.gpus if getattr(g, "zero_copy_read_gbps", None)]
    h2d = [g.h2d_gbps for g in plat.gpus if getattr(g, "h2d_gbps", None)]
    if not reads:
        out.warn(f"{path} has no measured zero-copy read rate: no step time predicted")
    # The slowest GPU bounds a TP step.
    return (min(reads) if reads else None), (min(h2d) if h2d else None)


def simulate_cmd(
    trace: Annotated[Path, typer.Option("--trace", help="Routing trace (.npz from `balance --trace`).")],
    recipe: RecipeOpt = None,
    hot_gib: HotGibOpt = None,
    fit: Annotated[Path | None, typer.Option("--fit", help="Fit the static plan on this histogram.")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Use this plan.json as the static hot set.")] = None,
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policies to run.")] = (
        "static,dynamic,lru,lfu,oracle"),
    batch: Annotated[int | None, typer.Option("--batch", help="Regroup the trace's tokens into steps of B.")] = None,
    window_steps: Annotated[int | None, typer.Option(
        "--window-steps", help="Steps per reporting and oracle window (default: dyn_steps).")] = None,
    dyn_steps: Annotated[str | None, typer.Option("--dyn-steps", help="Override HOTSPLIT_DYN_STEPS.")] = None,
    dyn_max_swaps: Annotated[str | None, typer.Option(
        "--dyn-max-swaps", help="Override HOTSPLIT_DYN_MAX_SWAPS.")] = None,
    dyn_margin: Annotated[str | None, typer.Option("--dyn-margin", help="Override HOTSPLIT_DYN_MARGIN.")] = None,
    platform: PlatformOpt = None,
    plot: PlotOpt = None,
    json: JsonOpt = False,
) -> None:
    """Replay a routing trace under hot-set policies and compare hit rate and PCIe bytes per step."""
    from ..knobs import resolve_knobs
    from ..recipe import load_recipe
    from ..simulate import LAYER_SPLIT, SimConfig, choose_budget, rebatch, simulate, summarise
    from ..sizes import expert_bytes_per_rank
    from ..trace import Trace, load_trace

    out = Output(json)
    names = _policies(policies)
    if recipe is None:
        raise UsageError("simulate needs --recipe to know the expert sizes", "pass --recipe NAME or a YAML path")
    if fit is not None and plan is not None:
        raise UsageError("--fit and --plan both give the static hot set", "pass one of them")
    if batch is not None and batch < 1:
        raise UsageError(f"--batch: must be >= 1, got {batch}")
    if window_steps is not None and window_steps < 1:
        raise UsageError(f"--window-steps: must be >= 1, got {window_steps}")
    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib, "dyn_steps": dyn_steps,
                                                   "dyn_max_swaps": dyn_max_swaps, "dyn_margin": dyn_margin})
    if rec.parallel.ep > 1:
        raise UsageError(f"recipe {rec.name!r} uses ep={rec.parallel.ep}; simulate models one rank of a TP "
                         "deployment", "use a recipe with ep: 1 (EP layouts: `hotsplit place`)")
    E = rec.model.num_experts
    tr = load_trace(trace, E)
    unknown = [x for x in tr.layers if x not in rec.model.moe_layer_ids]
    if unknown:
        raise PlanError(f"{trace}: layer {unknown[0]} is not a MoE layer of recipe {rec.name!r}",
                        "use the recipe of the model the trace was captured on")
    ids = tr.topk_ids_SLTK if batch is None else rebatch(tr.topk_ids_SLTK, batch)
    tr = Trace(ids, tr.layers)
    if tr.num_steps == 0:
        raise PlanError(f"{trace}: the trace has no steps")
    counts_SLE = tr.counts_SLE(E)
    assignments_S = counts_SLE.sum(axis=(1, 2))
    if not assignments_S.any():
        raise PlanError(f"{trace}: the trace routes no tokens (every id is padding)")
    size = expert_bytes_per_rank(rec)
    pf = None
    if plan is not None:
        from ..planfile import load_plan

        pf = load_plan(plan)
    budget = choose_budget(rec, knobs, pf)
    budget_bytes = budget.budget_bytes
    wsteps = min(window_steps or knobs.dyn_steps, tr.num_steps)
    read_gbps = h2d_gbps = None
    if platform is not None:
        read_gbps, h2d_gbps = _platform_rates(platform, out)

    from ..planner import plan_hot_set

    if pf is not None:
        missing = [x for x in tr.layers if x not in pf.layers]
        if missing:
            raise PlanError(f"{plan}: has no hot set for trace layer {missing[0]}", "plan on a matching histogram")
        if pf.expert_bytes is not None and pf.expert_bytes != size:
            out.warn(f"{plan} was planned with {pf.expert_bytes} B experts, recipe {rec.name!r} has {size} B")
        static_hot = pf.hot_LE(tr.layers, E, model=rec.name)
        if int(static_hot.sum()) * size > budget_bytes:
            raise PlanError(f"{plan}: its hot set ({gib(int(static_hot.sum()) * size)}) exceeds the "
                            f"budget of {gib(budget_bytes)}", "pass the plan's --hot-gib")
        static_source = f"plan {plan}"
    else:
        if fit is not None:
            from ..hist import load_hist

            hist = load_hist(fit)
            if hist.num_experts != E or tuple(hist.layers) != tr.layers:
                raise PlanError(f"{fit}: layers {list(hist.layers)} x {hist.num_experts} experts do not match the "
                                f"trace ({list(tr.layers)} x {E})", "fit on a histogram of the same model")
            from ..planfile import check_hist_matches_recipe

            for warning in check_hist_matches_recipe(hist, rec, fit):
                out.warn(warning)
            fit_counts, static_source = hist.counts_LE, f"fitted on {fit}"
        else:
            fit_counts = counts_SLE[:wsteps].sum(axis=0)
            static_source = f"fitted on the trace's first window (steps 0..{wsteps - 1})"
            if not fit_counts.any():
                raise PlanError(f"{trace}: the first window routes no tokens", "pass --fit HIST or --plan")
        static_hot = plan_hot_set(fit_counts, size, budget_bytes).hot_RLE[0]

    cfg = SimConfig(size, budget_bytes, wsteps, knobs.dyn_steps, knobs.dyn_max_swaps, knobs.dyn_margin)
    total_steps = tr.num_steps * len(names)
    with out.progress(f"replaying {tr.num_steps} steps x {len(names)} policies", total_steps) as advance:
        runs = simulate(counts_SLE, static_hot, cfg, names, advance)
    sums = {n: summarise(r, assignments_S, size, wsteps, read_gbps, h2d_gbps) for n, r in runs.items()}
    doc = {
        "trace": str(trace),
        "recipe": rec.name,
        "steps": tr.num_steps,
        "tokens_per_step": int(tr.topk_ids_SLTK.shape[2]),
        "top_k": tr.top_k,
        "layers": list(tr.layers),
        "num_experts": E,
        "routed_assignments": float(assignments_S.sum()),
        "budget": {"hot_gib": budget.hot_gib, "source": budget.source, "origin": budget.origin,
                   "budget_bytes": budget_bytes, "expert_bytes": size, "hot_slots": cfg.hot_slots},
        "static": static_source,
        "window_steps": wsteps,
        "knobs": {"dyn_steps": knobs.dyn_steps, "dyn_max_swaps": knobs.dyn_max_swaps, "dyn_margin": knobs.dyn_margin},
        "platform": {"path": str(platform), "zero_copy_read_gbps": read_gbps, "h2d_gbps": h2d_gbps}
        if platform else None,
        "policies": {n: s.to_doc() for n, s in sums.items()},
    }
    if platform is not None:
        from ..coldpath import rates_from_platform, replay_cold_paths
        from ..platform_file import load_platform

        plat = load_platform(platform)
        rates, where = rates_from_platform(plat, plat.gpus[0].index if plat.gpus else -1)
        times = replay_cold_paths(counts_SLE, static_hot, size, rates, doc["tokens_per_step"])
        doc["cold_paths"] = {"policy": "static", "rates": where, **times.to_doc()}
    if plot is not None:
        from ..plotting import save_png

        title = f"{rec.name}: {gib(budget_bytes)} hot, {cfg.hot_slots} slots"
        save_png(plot, lambda fig, ax: draw_policies(ax, sums, wsteps, title))
        if len(next(iter(sums.values())).window_hit_rate_W) == 1:
            out.note(f"note: the trace is one window of {wsteps} steps, so {plot} shows one bar per policy, not a "
                     "curve; pass --window-steps below that for hit rate over steps")

    def render() -> None:
        out.print(f"trace {trace}: {tr.num_steps} steps x {doc['tokens_per_step']} tokens x top-{tr.top_k}, "
                  f"{len(tr.layers)} layers x {E} experts")
        out.print(f"budget {gib(budget_bytes)} per rank (from {budget.origin}) = {cfg.hot_slots} hot experts of "
                  f"{size / (1 << 20):.2f} MiB; static {static_source}; windows of {wsteps} steps; "
                  f"dyn_steps={knobs.dyn_steps} dyn_max_swaps={knobs.dyn_max_swaps} dyn_margin={knobs.dyn_margin:g}")
        cols = ["policy", "hit rate", "min window", "PCIe MiB/step", "zero-copy MiB/step", "experts copied"]
        if read_gbps:
            cols.insert(4, "step ms")
        t = out.table(*cols)
        for n, s in sums.items():
            row = [n, pct(s.hit_rate, 2), pct(float(s.window_hit_rate_W.min()), 1),
                   f"{s.pcie_bytes_per_step / (1 << 20):.2f}", f"{s.zero_copy_bytes_per_step / (1 << 20):.2f}",
                   str(s.copies)]
            if read_gbps:
                row.insert(4, "-" if s.step_ms is None else f"{s.step_ms:.3f}")
            t.add_row(*row)
        out.print(t)
        for n in sums:
            out.print(f"  {n}: {LAYER_SPLIT[n]}")
        if "cold_paths" in doc:
            c = doc["cold_paths"]

            def ms(x):
                return "-" if x is None else f"{x:.3f} ms"

            out.print(f"cold time per step of the static hot set by cold path ({c['rates']}): gpu {ms(c['gpu_ms'])}, "
                      f"cpu {ms(c['cpu_ms'])}, split {ms(c['split_ms'])} (CPU share {100 * c['split_cpu_share']:.0f}%)"
                      f"; fastest here: {c['fastest'] or '-'}")

    out.emit(doc, render)
    if plot is not None:
        out.note(f"wrote {plot}")


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
            ax.plot(x, 100 * s.window_hit_rate_W, marker=".", label=label(n, s))
        ax.set_xlabel(f"step (windows of {wsteps})")
        ax.set_ylabel("hit rate per window (%)")
        ax.legend(fontsize=8)
    ax.set_title(f"{title}; PCIe MiB/step {'on the bars' if windows == 1 else 'in legend'}")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
