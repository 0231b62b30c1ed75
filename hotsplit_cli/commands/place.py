"""`hotsplit place HIST --ranks N`: replicas and placement of physical experts on EP ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ..errors import PlanError, UsageError
from ..options import JsonOpt, OutOpt, RecipeOpt
from ..output import Output

FORMATS = ("native", "sglang")


def _windows(hist) -> np.ndarray:
    return hist.windows_WLE if hist.windows_WLE is not None else hist.counts_LE[None]


def place_cmd(
    hist_file: Annotated[Path, typer.Argument(metavar="HIST", help="Routing histogram to fit (hotsplit.hist/1).")],
    ranks: Annotated[int, typer.Option("--ranks", help="EP ranks (GPUs).")],
    redundant: Annotated[int, typer.Option("--redundant", help="Redundant physical experts per layer.")] = 0,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes; > 1 packs expert groups on nodes.")] = 1,
    groups: Annotated[int | None, typer.Option(
        "--groups", help="Expert groups (default: the recipe's n_group, else --nodes).")] = None,
    output: OutOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="native (hotsplit.placement/1) or sglang.")] = "native",
    recipe: RecipeOpt = None,
    eval_hist: Annotated[Path | None, typer.Option(
        "--eval", help="Compare layouts on this (later) histogram.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random layout in the comparison.")] = 0,
    fit: Annotated[str, typer.Option(
        "--fit", help="Fit on every window, the totals, or auto: whichever does better on held-out windows.")
    ] = "auto",
    json: JsonOpt = False,
) -> None:
    """Replicate and place experts on EP ranks, balancing every window, never two replicas on a rank."""
    from ..hist import load_hist
    from ..placement import Geometry, check_geometry, place_experts
    from ..placement_eval import choose_fit, eplb_layout, evaluate, random_layout, trivial_layout
    from ..placement_file import placement_doc, save_placement, sglang_doc

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
        from ..recipe import load_recipe

        rec = load_recipe(recipe)
    hist = load_hist(hist_file)
    E = hist.num_experts
    if rec is not None:
        from ..planfile import check_hist_matches_recipe

        for warning in check_hist_matches_recipe(hist, rec, hist_file):
            out.warn(warning)
    if groups is None:
        groups = rec.model.n_group if rec is not None and rec.model.n_group % max(nodes, 1) == 0 else max(nodes, 1)
    geo = Geometry(ranks, redundant, nodes, groups)
    check_geometry(E, geo)
    later = None
    if eval_hist is not None:
        later = load_hist(eval_hist)
        if later.num_experts != E or tuple(later.layers) != tuple(hist.layers):
            raise PlanError(f"{eval_hist}: layers {list(later.layers)} x {later.num_experts} experts do not match "
                            f"{hist_file} ({list(hist.layers)} x {E})", "evaluate on a histogram of the same model")
    all_W = _windows(hist)
    choice = choose_fit(all_W, hist.layers, geo, fit)
    fit_W = all_W if choice.mode == "windows" else hist.counts_LE[None]
    placement = place_experts(fit_W, hist.layers, geo)
    fitted = evaluate(all_W, placement)
    layouts = {
        "trivial": trivial_layout(E, hist.layers, geo),
        "random": random_layout(E, hist.layers, geo, seed),
        "totals-only": eplb_layout(hist.counts_LE, hist.layers, geo),
        "hotsplit": placement,
    }
    from ..placement_eval import duplicate_count

    compare = {}
    for name, lay in layouts.items():
        row = {"fitted": evaluate(all_W, lay).to_doc(), "duplicate_ranks": duplicate_count(lay)}
        if later is not None:
            row["eval"] = evaluate(_windows(later), lay).to_doc()
        compare[name] = row
    source = {"histogram": str(hist_file), "windows": int(all_W.shape[0]), "fit": choice.to_doc(),
              "num_redundant": redundant, "num_groups": groups}
    doc = placement_doc(placement, E, fitted, source)
    if output is not None:
        if fmt == "sglang":
            save_placement(output, sglang_doc(placement, rec.model.num_hidden_layers, E))
        else:
            save_placement(output, doc)
    report = {"placement": {k: v for k, v in doc.items() if k not in ("phy2log", "log2phy", "logcnt")},
              "output": str(output) if output else None, "format": fmt, "compare": compare,
              "eval": str(eval_hist) if eval_hist else None}

    def render() -> None:
        P = E + redundant
        out.print(f"{len(hist.layers)} layers x {E} experts -> {P} physical experts on {ranks} ranks "
                  f"({P // ranks} per rank), {nodes} node(s), {groups} group(s); {all_W.shape[0]} window(s) "
                  f"in {hist_file}")
        out.print(f"fitted on the {choice.mode}: {choice.reason}")
        cols = ["layout", "fitted balancedness", "dup ranks"]
        if later is not None:
            cols += ["eval bottleneck", "eval imbalance", "eval balancedness"]
        t = out.table(*cols, title=None)
        for name, row in compare.items():
            cells = [name, f"{row['fitted']['balancedness']:.4f}", str(row["duplicate_ranks"])]
            if later is not None:
                e = row["eval"]
                cells += [f"{e['bottleneck']:.6g}", f"{e['imbalance']:.4f}", f"{e['balancedness']:.4f}"]
            t.add_row(*cells)
        out.print(t)
        out.print("balancedness = mean / max rank load summed over windows and layers (1 = perfect); "
                  "dup ranks = (layer, rank) pairs holding two replicas of one expert")

    out.emit(report, render)
    if output is not None:
        out.note(f"wrote {output} ({fmt})")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("place")(place_cmd)
