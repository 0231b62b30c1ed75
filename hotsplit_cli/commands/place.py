"""`hotsplit place HIST --ranks N`: replicas and placement of physical experts on EP ranks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.gpu_fit import gpu_fit, placement_expert_bytes
from hotsplit_cli.hotset.placetime import check_time_request, place_by_time
from hotsplit_cli.options import HotGibOpt, JsonOpt, OutOpt, PlatformOpt, RecipeOpt
from hotsplit_cli.output import Output, gib
from hotsplit_cli.placement.file import save_placement
from hotsplit_cli.placement.report import PlaceRequest, place_from_hist

if TYPE_CHECKING:
    from hotsplit_cli.placement.report import PlaceReport

FORMATS = ("native", "sglang")
PlacePlanOpt = Annotated[Path | None, typer.Option(
    "--plan", show_default="none",
    help="With --platform: time at this plan's budget and stored precisions (auto: each expert's).")]


def place_cmd(
    hist_file: Annotated[Path, typer.Argument(metavar="HIST", help="Routing histogram to fit (hotsplit.hist/1).")],
    ranks: Annotated[int, typer.Option("--ranks", help="EP ranks (GPUs).")],
    redundant: Annotated[int, typer.Option("--redundant", help="Redundant physical experts per layer.")] = 0,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes; > 1 packs expert groups on nodes.")] = 1,
    groups: Annotated[int | None, typer.Option(
        "--groups", show_default="the recipe's n_group, else --nodes", help="Expert groups.")] = None,
    output: OutOpt = None,
    fmt: Annotated[str, typer.Option("--format", metavar="native|sglang",
                                     help="native (hotsplit.placement/1) or sglang.")] = "native",
    recipe: RecipeOpt = None,
    eval_hist: Annotated[Path | None, typer.Option(
        "--eval", show_default="none", help="Compare layouts on this (later) histogram.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random layout in the comparison.")] = 0,
    fit: Annotated[str, typer.Option(
        "--fit", metavar="windows|totals|auto",
            help="Fit on every window, the totals, or auto: whichever does better on held-out windows.")
    ] = "auto",
    platform: PlatformOpt = None,
    hot_gib: HotGibOpt = None,
    balance: Annotated[str | None, typer.Option(
        "--balance", metavar="tokens|time", show_default="time",
        help="With --platform: write the layout balancing tokens or each rank's predicted time.")
    ] = None,
    plan: PlacePlanOpt = None,
    json: JsonOpt = False,
) -> None:
    """Replicate and place experts on EP ranks, balancing every window, never two replicas on a rank."""
    out = Output(json)
    if fmt not in FORMATS:
        raise UsageError(f"--format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "sglang" and recipe is None:
        raise UsageError("--format sglang writes one row per model layer and needs --recipe",
                         "pass --recipe NAME or a YAML path")
    if fmt == "sglang" and output is None:
        raise UsageError("--format sglang needs -o FILE")
    rec = None
    if recipe is not None:
        rec = load_recipe(recipe)
        if rec.parallel.ep > 1 and ranks != rec.parallel.ep:
            raise UsageError(f"--ranks {ranks}: recipe {rec.name!r} has ep={rec.parallel.ep}",
                             f"place with --ranks {rec.parallel.ep}, or use a recipe with ep: {ranks}")
    req = PlaceRequest(hist_file, ranks, redundant, nodes, groups, eval_hist, seed, fit, platform, balance or "time",
                       plan)
    if platform is None:
        _check_untimed(hot_gib, balance, plan)
    report = place_from_hist(req, rec, out.warn) if platform is None else _place_by_time(req, rec, hot_gib, out)
    fit = _gpu_fit(report, rec, out)
    if output is not None:
        save_placement(output, report.file_doc(fmt, rec))
    out.emit({**report.to_doc(output, fmt), "gpu_memory": fit}, lambda: _render(out, report))
    if output is not None:
        out.note(f"wrote {output} ({fmt})")


def _check_untimed(hot_gib: str | None, balance: str | None, plan: Path | None) -> None:
    """Without --platform, refuse the options that only time the ranks."""
    if hot_gib is not None or balance is not None:
        raise UsageError("--hot-gib and --balance time the ranks and need --platform",
                         "pass --platform platform.json from `hotsplit probe`")
    if plan is not None:
        raise UsageError("--plan gives the budget and stored precisions the ranks are timed at and needs --platform",
                         "pass --platform platform.json from `hotsplit probe`")


def _place_by_time(req, rec, hot_gib: str | None, out: Output) -> PlaceReport:
    """`place --platform`: the budget knob resolved (flag > env > recipe > auto), then the library."""
    import os


    check_time_request(req, rec)
    return place_by_time(req, rec, resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib}), out.warn)


def _gpu_fit(report: PlaceReport, rec, out: Output) -> dict | None:
    """With a recipe: each rank's expert slots against its GPU's memory, warned when they cannot fit."""
    if rec is None:
        return None

    fit = gpu_fit(placement_expert_bytes(report.placement, rec), rec)
    if fit.warning():
        out.warn(fit.warning())
    return fit.to_doc()


def _render(out: Output, report: PlaceReport) -> None:
    """The human report of a `PlaceReport`: the geometry, how it was fitted, the layouts compared."""
    geo, req, E = report.geometry, report.request, report.hist.num_experts
    P = E + geo.num_redundant
    out.print(f"{len(report.hist.layers)} layers x {E} experts -> {P} physical experts on {geo.num_ranks} ranks "
              f"({P // geo.num_ranks} per rank), {geo.num_nodes} node(s), {geo.num_groups} group(s); "
              f"{report.windows} window(s) in {req.hist_path}")
    out.print(f"fitted on the {report.fit.mode}: {report.fit.reason}")
    later = req.eval_path is not None
    cols = ["layout", "fitted balancedness", "dup ranks"]
    if later:
        cols += ["eval bottleneck, assignments", "eval imbalance", "eval balancedness"]
    t = out.table(*cols, title=None)
    for name, row in report.compare.items():
        cells = [name, f"{row['fitted']['balancedness']:.4f}", str(row["duplicate_ranks"])]
        if later:
            e = row["eval"]
            cells += [f"{e['bottleneck']:,.1f}", f"{e['imbalance']:.4f}", f"{e['balancedness']:.4f}"]
        t.add_row(*cells)
    out.print(t)
    if report.times is not None:
        _render_times(out, report.times, later)
    out.print("balancedness = mean / max rank load summed over windows and layers (1 = perfect); "
              "dup ranks = (layer, rank) pairs holding two replicas of one expert"
              + ("; bottleneck = the busiest rank's routed assignments summed over windows and layers (a replicated "
                 "expert's load split evenly, hence the fractions); imbalance = bottleneck / mean" if later else ""))


def _render_times(out: Output, times: dict, later: bool) -> None:
    """Predicted time per decode step of the token- and the time-balanced layout, side by side."""
    out.print(f"predicted time per decode step at batch {times['batch']}, hot budget "
              f"{gib(times['budget_bytes'])} per rank ({times['budget_source']}), cold reads at "
              f"{times['read_gbps']:.1f} GB/s ({times['read_source']}); {times['hot_work']}:")
    cols = ["balance", "fitted max-rank ms/step", "fitted slowest rank total ms"]
    cols += ["eval max-rank ms/step", "eval slowest rank total ms"] if later else []
    t = out.table(*cols, title=None)
    for name, row in times["layouts"].items():
        cells = [name + (" (written)" if name == times["chosen"] else "")]
        for key in ("fitted", "eval") if later else ("fitted",):
            cells += [f"{row[key]['step_ms']:.2f}", f"{max(row[key]['rank_ms']):.2f}"]
        t.add_row(*cells)
    out.print(t)
    out.print("max-rank ms/step = sum over layers of the slowest rank's cold reads (each layer waits for it)")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("place")(place_cmd)
