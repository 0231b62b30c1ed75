"""`hotsplit plan HIST --recipe R [--hot-gib X]`: the hot set per rank, its hit rate and bound."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.hotset.coldpath import fastest_spans
from hotsplit_cli.hotset.host_memory import host_fit
from hotsplit_cli.hotset.planfile import PlanResult, make_plan, plan_doc
from hotsplit_cli.options import RECIPE_HELP, HotGibOpt, JsonOpt, OutOpt, PlatformOpt, PrecisionOpt
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.traffic.hist import recorded_recipe


def plan_cmd(
    hist_file: Annotated[Path, typer.Argument(metavar="HIST", help="Routing histogram (hotsplit.hist/1).")],
    recipe: Annotated[str | None, typer.Option(
        "--recipe", "-r", metavar="RECIPE", show_default="the recipe the histogram records",
        help=f"{RECIPE_HELP[:-1]}; needed when the histogram records none (`balance` records it).")] = None,
    hot_gib: HotGibOpt = None,
    platform: PlatformOpt = None,
    placement: Annotated[
        Path | None, typer.Option("--placement", show_default="none: one hot set per rank of the recipe",
                                  help="placement.json from `hotsplit place`: plan each EP rank's "
                                  "hot set among the physical experts placed on it.")] = None,
    precision: PrecisionOpt = None,
    max_error: Annotated[float | None, typer.Option(
        "--max-error", min=0.0, show_default="none: needed by --precision auto",
        help="Expected error the precisions may spend (routing-share-weighted relative output error, measured "
             "by `balance --model`); required by --precision auto.")] = None,
    output: OutOpt = None,
    json: JsonOpt = False,
) -> None:
    """Plan which experts stay hot on each rank under a per-rank GiB budget."""
    out = Output(json)
    if recipe is None:
        recipe = recorded_recipe(hist_file)
        out.note(f"recipe: {recipe} (recorded in {hist_file})")
    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib, "precision": precision})
    result = make_plan(hist_file, rec, knobs, platform, placement, out.warn, max_error)
    stored = "native" if knobs.precision == "auto" else knobs.precision  # auto: no expert above native
    host = host_fit(rec, platform, precision=stored)
    if host is not None and not host.fits:
        out.warn(host.explain())
    doc = plan_doc(result)
    if output is not None:
        write_json_atomic(output, doc)
    out.emit(doc, lambda: _render(out, result, doc))
    if output is not None:
        out.note(f"wrote {output}")


def _render(out: Output, result: PlanResult, doc: dict) -> None:
    """The human report of a plan: budget, hot experts per layer and rank, hit rate, cold costs."""
    rec, hist, plan, budget = result.recipe, result.hist, result.plan, result.budget
    knob, dtype = doc["precision"]["knob"], rec.model.expert_dtype
    stored = dtype if knob == "native" else f"stored {knob}, checkpoint {dtype}"
    size = (f"expert {doc['expert_bytes'] / (1 << 20):.2f} MiB per rank ({stored})" if doc["expert_bytes"]
            else f"experts stored at the precision of each (checkpoint {dtype})")
    out.print(f"plan for {rec.name} ({rec.model.name}): {hist.num_layers} MoE layers x {hist.num_experts} "
              f"experts, {size}, tp={rec.parallel.tp} ep={doc['parallel']['ep']}")
    out.print(budget.explain())
    t = out.table("layer", "hot experts", "hit rate")
    for i, layer in enumerate(hist.layers):
        t.add_row(str(layer), str(int(plan.hot_RLE[:, i].any(axis=0).sum())), pct(plan.layer_hit_rate_L[i], 2))
    out.print(t)
    by_rank = "hit_rate" in doc["ranks"][0]  # plans on a placement: each rank's own figures
    t = out.table("rank", "hot experts", "used", "budget", "method",
                  *(["in-sample", "new traffic"] if by_rank else []))
    for r in doc["ranks"]:
        if r["rank"] % rec.parallel.tp == 0:
            label = str(r["rank"]) if rec.parallel.tp == 1 else f"{r['rank']}..{r['rank'] + rec.parallel.tp - 1}"
            t.add_row(label, str(r["hot_experts"]), gib(r["hot_bytes"]), gib(budget.budget_bytes), r["method"],
                      *([pct(r["hit_rate"], 2), _band_text(r.get("out_of_sample"))] if by_rank else []))
    out.print(t)
    if "bound" in doc["precision"]:
        _render_joint(out, plan, doc["precision"])
    else:
        verdict = "optimal (certified)" if plan.certified else "greedy (exact solver skipped: too large)"
        out.print(f"hit rate {pct(plan.hit_rate, 2)} in-sample (on the histogram it was fitted on), {verdict}; "
                  f"LP bound {pct(plan.bound_hit_rate, 2)}, gap {100 * plan.gap:.2f} pp")
    _render_precision(out, doc["precision"])
    held = doc["out_of_sample"]
    if held["available"]:
        out.print(f"expected hit rate on new traffic {pct(held['expected'], 2)}, range {100 * held['low']:.2f}-"
                  f"{pct(held['high'], 2)} (out-of-sample: refitted on earlier windows, judged on the next, "
                  f"over {len(held['origins'])} held-out windows)")
    else:
        out.print(f"expected hit rate on new traffic: not estimated: {held['reason']}")
    if result.costs:
        rate_text = "unknown" if result.rate.gbps is None else f"{result.rate.gbps:.1f} GB/s"
        where = f", {result.platform_path}" if result.platform_path else ""
        out.print(f"predicted cold reads per decode step at {rate_text} ({result.rate.source}{where}):")
        cols = ["batch", "cold experts/step", "cold bytes/step", "cold read ms/step"]
        steps = {t.batch: t.step_ms for t in result.rank_times or ()}
        t = out.table(*cols, *(["max-rank ms/step"] if steps else []))
        for c in result.costs:
            t.add_row(str(c.batch), f"{c.cold_experts:.1f}", gib(c.cold_bytes),
                      "-" if c.cold_ms is None else f"{c.cold_ms:.2f}", *([f"{steps[c.batch]:.2f}"] if steps else []))
        out.print(t)
        if steps:
            out.print("rank 0's reads; max-rank ms/step = sum over layers of the slowest rank's cold reads")
    if result.cold_paths is not None:
        _render_cold_paths(out, result.cold_paths)
    if "prefetch" in doc:
        _render_prefetch(out, doc["prefetch"])


def _render_prefetch(out: Output, pre: dict) -> None:
    """Predicted step time with and without staging slots, and the planned slot count's reason."""
    t = out.table("batch", "step ms, no prefetch", f"with {pre['slots']} slots ({pre['pool']})", "best slots here")
    for r in pre["steps"]:
        t.add_row(str(r["batch"]), f"{r['without_ms']:.3f}", f"{r['with_ms']:.3f}", str(r["best_slots"]))
    out.print("prefetch: predicted decode step time (cold reads and staged copies on the link, compute per layer):")
    out.print(t)
    out.print(f"prefetch: {pre['reason']}")


def _render_joint(out: Output, plan, block: dict) -> None:
    """An auto plan's certificate: it is bounded in PCIe bytes per step, not in hit rate."""
    bound = block["bound"]
    verdict = "optimal (certified)" if bound["certified"] else f"{bound['method']}"
    out.print(f"hit rate {pct(plan.hit_rate, 2)} in-sample (on the histogram it was fitted on); precisions and hot "
              f"set chosen together, {verdict}: PCIe {gib(block['pcie_bytes_per_step'])}/step, bound "
              f"{gib(bound['pcie_bytes_per_step'])}/step, gap {100 * bound['gap']:.2f}%")


def _render_precision(out: Output, block: dict) -> None:
    """Experts per stored precision, hot and cold; PCIe bytes per step; the expected error and its source."""
    t = out.table("precision", "expert MiB", "hot experts", "cold experts")
    for name, n in block["experts"].items():
        if n["hot"] + n["cold"] == 0:
            continue
        t.add_row(name, f"{block['expert_bytes'][name] / (1 << 20):.2f}", str(n["hot"]), str(n["cold"]))
    out.print(t)
    err = block["expected_error"]
    budget = "" if block["max_error"] is None else f" (budget {block['max_error']:g})"
    err_text = "errors unknown" if err is None else f"expected error {err:.4g}{budget}"
    out.print(f"stored precision {block['knob']}: PCIe {gib(block['pcie_bytes_per_step'])}/step at batch "
              f"{block['batch']}; {err_text}; {block['errors_from']}")
    for name, m in block["model"].items():
        out.print(f"  uniform {name} vs native, measured: next-token agreement {pct(m['agreement'], 2)}, "
                  f"mean KL {m['mean_kl']:.4g} over {m['tokens']} tokens")


def _band_text(band: dict | None) -> str:
    """`52.6% (51.4-53.5%)`: a forecast and its range over the held-out windows."""
    if not band:
        return "-"
    return f"{pct(band['expected'], 1)} ({100 * band['low']:.1f}-{pct(band['high'], 1)})"


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
    spans = fastest_spans(paths["by_batch"])
    if spans:
        out.print(f"fastest here: {spans}; choose with run --cold-path or HOTSPLIT_COLD_PATH")
    if paths["by_batch"] and paths["by_batch"][0]["gpu_ms"] is not None and "no GPU" in paths["rates"]:
        out.print("no GPU: the device path is this CPU, which the CPU path would share, so the split gives the CPU "
                  "path nothing (docs/runtime.md)")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
