"""`hotsplit hist show FILE`: load balance, concentration and the GiB needed per coverage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.options import JsonOpt, PlotOpt, RecipeOpt
from hotsplit_cli.output import Output, gib, pct
from hotsplit_cli.plotting import save_png
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.histstats import (
    COVERAGE_TARGETS,
    HOT_FLAG_RATIO,
    TOP_FRACTIONS,
    HistReport,
    hist_report,
    top_count,
)
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe


def hist_show_cmd(
    file: Annotated[Path, typer.Argument(metavar="HIST", help="Routing histogram (hotsplit.hist/1).")],
    recipe: RecipeOpt = None,
    plot: PlotOpt = None,
    json: JsonOpt = False,
) -> None:
    """Report what to check in a routing histogram before launch."""
    out = Output(json)
    hist = load_hist(file)
    expert_bytes, ranks = None, 1
    if recipe is not None:
        rec = load_recipe(recipe)
        for warning in check_hist_matches_recipe(hist, rec, file):
            out.warn(warning)
        expert_bytes, ranks = expert_bytes_per_rank(rec), rec.parallel.ep
    report = hist_report(hist, expert_bytes, ranks)
    if plot is not None:
        plot_coverage(plot, report)
    out.emit({"file": str(file), **report.to_doc()}, lambda: render_hist_report(out, report))
    if plot is not None:
        out.note(f"wrote {plot}")


def render_hist_report(out: Output, report: HistReport) -> None:
    out.print(f"{report.model}: {report.num_layers} MoE layers x {report.num_experts} experts, top-{report.top_k}, "
              f"{report.tokens:,} tokens, {report.total:,.0f} routed assignments")
    out.print(f"source: {report.source}")
    E, n = report.num_experts, report.num_layers * report.num_experts
    top = f"top {top_count(0.10, E)} of {E}"
    t = out.table("layer", "total", "mean", "max", "max/mean", top, f"> {HOT_FLAG_RATIO:g}x mean")
    for x in report.layers:
        flag = ", ".join(map(str, x.flagged[:6])) + (" ..." if len(x.flagged) > 6 else "")
        t.add_row(str(x.layer), f"{x.total:,.0f}", f"{x.mean:,.1f}", f"{x.max:,.0f}", f"{x.max_over_mean:.2f}",
                  pct(x.top10_share), f"{len(x.flagged)}: {flag}" if x.flagged else "0")
    out.print(t)
    out.print(f"max/mean: the busiest expert's load over the layer's mean; {top}: share of the layer's "
              f"routed assignments on its hottest {top_count(0.10, E)} experts (10% rounded up to whole experts: "
              f"{pct(top_count(0.10, E) / E)}); > {HOT_FLAG_RATIO:g}x mean: how many experts "
              f"carry more than {HOT_FLAG_RATIO:g}x the layer's mean load, and their ids")
    flagged = sum(len(x.flagged) for x in report.layers)
    if flagged:
        out.print(f"{flagged} experts are above {HOT_FLAG_RATIO:g}x their layer's mean load")
    t = out.table("hottest experts, all layers", "share of routed traffic")
    for f in TOP_FRACTIONS:
        t.add_row(f"{top_count(f, n)} of {n} ({pct(top_count(f, n) / n)})", pct(report.top_share[f]))
    out.print(t)
    per_rank = report.cover_rank_experts
    cols = ["coverage", "experts"] + (["experts per rank"] if per_rank else []) + (
        ["bytes per rank"] if report.cover_bytes else [])
    t = out.table(*cols)
    for target in COVERAGE_TARGETS:
        row = [pct(target, 0), f"{report.cover_experts[target]:,}"] + ([f"{per_rank[target]:,}"] if per_rank else [])
        if report.cover_bytes:
            row.append(gib(report.cover_bytes[target]))
        t.add_row(*row)
    out.print(t)
    if per_rank:
        out.print(f"per rank: assumes the experts split evenly and contiguously over ep {report.ranks} ranks "
                  f"(rank r holds experts r*{report.num_experts // report.ranks}..); each rank covers the share of "
                  f"its own traffic, and the neediest rank sets the figure. `hotsplit plan --placement` plans a "
                  f"placement's ranks")
    if not report.cover_bytes:
        out.print("add --recipe R to see the GiB each coverage needs")


def plot_coverage(path: Path, report: HistReport) -> None:
    def draw(fig, ax):
        n = len(report.curve_share)
        if report.curve_bytes is not None:
            share = report.curve_rank_share if report.curve_rank_share is not None else report.curve_share
            ax.plot(report.curve_bytes / (1 << 30), share * 100)
            ax.set_xlabel("hot experts per rank (GiB)" + (f", neediest of {report.ranks} contiguous ranks"
                                                          if report.ranks > 1 else ""))
        else:
            ax.plot([100 * (i + 1) / n for i in range(n)], report.curve_share * 100)
            ax.set_xlabel("hottest experts (% of all)")
        ax.set_ylabel("routed assignments served hot (%)")
        ax.set_title(f"{report.model}: coverage curve")
        ax.grid(alpha=0.3)

    save_png(path, draw)


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    hist_app.command("show")(hist_show_cmd)
