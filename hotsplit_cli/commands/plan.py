"""`hotsplit plan HIST --recipe R [--hot-gib X]`: the hot set per rank, its hit rate and bound."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ..errors import PlanError, UsageError
from ..hist import load_hist
from ..knobs import resolve_knobs
from ..options import HotGibOpt, JsonOpt, OutOpt, PlatformOpt, RecipeOpt
from ..output import Output, gib, pct
from ..recipe import GIB, load_recipe
from ..sizes import BudgetDerivation, derive_hot_budget, expert_bytes_per_rank, over_gpu


def plan_cmd(
    hist_file: Annotated[Path, typer.Argument(metavar="HIST", help="Routing histogram (hotsplit.hist/1).")],
    recipe: RecipeOpt = None,
    hot_gib: HotGibOpt = None,
    platform: PlatformOpt = None,
    placement: Annotated[
        Path | None, typer.Option("--placement", help="placement.json from `hotsplit place`: plan each EP rank's "
                                  "hot set among the physical experts placed on it.")] = None,
    output: OutOpt = None,
    json: JsonOpt = False,
) -> None:
    """Plan which experts stay hot on each rank under a per-rank GiB budget."""
    out = Output(json)
    if recipe is None:
        raise UsageError("plan needs --recipe to know the expert sizes and parallelism",
                         "pass --recipe NAME (shipped: recipes/*.yaml) or a YAML path")
    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib})
    hist = load_hist(hist_file)
    from ..planfile import check_hist_matches_recipe

    for warning in check_hist_matches_recipe(hist, rec, hist_file):
        out.warn(warning)
    plat = None
    if platform is not None:
        from ..platform_file import load_platform

        plat = load_platform(platform)
    derivation: BudgetDerivation | None = None
    mem, mem_source = None, "recipe hardware.gpu_mem_gib"
    free = [g.mem_free_bytes for g in plat.gpus if g.mem_free_bytes is not None] if plat is not None else []
    if free:
        mem, mem_source = min(free) / GIB, f"{platform}: smallest free GPU memory"
    if knobs.hot_gib is not None:
        budget_gib = knobs.hot_gib
        source = knobs.origin("hot_gib")
        too_big = over_gpu(rec, budget_gib, knobs.vram_reserve_gib, mem, mem_source)
        if too_big:
            out.warn(f"{too_big}; planned anyway (for a larger GPU?)")
    else:
        if plat is not None and not free:
            raise PlanError(f"{platform} has no GPU with a measured free memory",
                            "pass --hot-gib, or probe on the GPU machine")
        derivation = derive_hot_budget(rec, knobs.vram_reserve_gib, mem, mem_source)
        budget_gib, source = derivation.hot_gib, "auto"
    from ..planfile import cold_costs, plan_doc, plan_for_placement, plan_for_recipe

    budget_bytes = int(budget_gib * GIB)
    layout = None
    if placement is not None:
        from ..placement_file import load_placement

        layout = load_placement(placement)
        plan = plan_for_placement(hist, rec, budget_bytes, layout)
    else:
        plan = plan_for_recipe(hist, rec, budget_bytes)
    costs, rate, rate_source = None, None, ""
    if plat is not None:
        rates = [g.zero_copy_read_gbps for g in plat.gpus if g.zero_copy_read_gbps]
        rate = min(rates) if rates else plat.host_copy_gbps
        rate_source = "slowest GPU's zero-copy read" if rates else "host memory copy (no GPU measured)"
        costs = cold_costs(hist, plan.hot_RLE[0], expert_bytes_per_rank(rec), rate)
    elif rec.hardware.pcie_gbps:  # no measurement: the rate the recipe states
        rate, rate_source = rec.hardware.pcie_gbps, "recipe hardware.pcie_gbps, not measured"
        costs = cold_costs(hist, plan.hot_RLE[0], expert_bytes_per_rank(rec), rate)
    doc = plan_doc(hist, hist_file, rec, knobs, plan, budget_gib, source, derivation, costs,
                   str(platform) if platform else None, layout, str(placement) if placement else None,
                   rate, rate_source or None)
    if plat is not None:
        from ..planfile import cold_path_prediction

        doc["cold_paths"] = cold_path_prediction(hist, plan.hot_RLE[0], expert_bytes_per_rank(rec), plat)
    if output is not None:
        from ..jsonio import write_json_atomic

        write_json_atomic(output, doc)

    def render() -> None:
        size = doc["expert_bytes"]
        out.print(f"plan for {rec.name} ({rec.model.name}): {hist.num_layers} MoE layers x {hist.num_experts} "
                  f"experts, expert {size / (1 << 20):.2f} MiB per rank ({rec.model.expert_dtype}), "
                  f"tp={rec.parallel.tp} ep={doc['parallel']['ep']}")
        if derivation is not None:
            out.print(derivation.explain())
        else:
            out.print(f"hot budget {gib(budget_bytes)} per rank (from {source})")
        t = out.table("layer", "hot experts", "hit rate")
        for i, layer in enumerate(hist.layers):
            t.add_row(str(layer), str(int(plan.hot_RLE[:, i].any(axis=0).sum())), pct(plan.layer_hit_rate_L[i], 2))
        out.print(t)
        t = out.table("rank", "hot experts", "used", "budget", "method")
        for r in doc["ranks"]:
            if r["rank"] % rec.parallel.tp == 0:
                label = str(r["rank"]) if rec.parallel.tp == 1 else f"{r['rank']}..{r['rank'] + rec.parallel.tp - 1}"
                t.add_row(label, str(r["hot_experts"]), gib(r["hot_bytes"]), gib(budget_bytes), r["method"])
        out.print(t)
        verdict = "optimal (certified)" if plan.certified else "greedy (exact solver skipped: too large)"
        out.print(f"hit rate {pct(plan.hit_rate, 2)}, {verdict}; LP bound {pct(plan.bound_hit_rate, 2)}, "
                  f"gap {100 * plan.gap:.2f} pp")
        if costs:
            rate_text = "unknown" if rate is None else f"{rate:.1f} GB/s"
            where = f", {platform}" if platform else ""
            out.print(f"predicted cold reads per decode step at {rate_text} ({rate_source}{where}):")
            t = out.table("batch", "cold experts/step", "cold bytes/step", "cold read ms/step")
            for c in costs:
                t.add_row(str(c.batch), f"{c.cold_experts:.1f}", gib(c.cold_bytes),
                              "-" if c.cold_ms is None else f"{c.cold_ms:.2f}")
            out.print(t)
        if "cold_paths" in doc:
            _render_cold_paths(out, doc["cold_paths"])

    out.emit(doc, render)
    if output is not None:
        out.note(f"wrote {output}")


def _render_cold_paths(out: Output, paths: dict) -> None:
    """Predicted cold time per decode step of each cold path (the `cold_path` knob), fastest marked."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    out.print(f"predicted cold time per decode step by cold path ({paths['rates']}):")
    t = out.table("batch", "gpu ms", "cpu ms", "split ms", "split: CPU share", "fastest")
    for b in paths["by_batch"]:
        t.add_row(str(b["batch"]), ms(b["gpu_ms"]), ms(b["cpu_ms"]), ms(b["split_ms"]),
                  f"{100 * b['split_cpu_share']:.0f}%", b["fastest"] or "-")
    out.print(t)
    runs: list[list] = []  # [path, first batch, last batch] of consecutive batch sizes
    for b in paths["by_batch"]:
        if runs and runs[-1][0] == b["fastest"]:
            runs[-1][2] = b["batch"]
        else:
            runs.append([b["fastest"], b["batch"], b["batch"]])
    spans = [f"{p} (batch {lo}{'' if lo == hi else f'-{hi}'})" for p, lo, hi in runs if p]
    if spans:
        out.print(f"fastest here: {', '.join(spans)}; choose with run --cold-path or HOTSPLIT_COLD_PATH")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
