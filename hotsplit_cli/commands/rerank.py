"""`hotsplit rerank REF MINE -o OUT`: a reference histogram re-ranked for my traffic."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.rerank import RerankRequest, rerank_files
from hotsplit_cli.options import HotGibOpt, JsonOpt, OutOpt, RecipeOpt
from hotsplit_cli.output import Output, pct
from hotsplit_cli.traffic.hist import save_hist

if TYPE_CHECKING:
    from hotsplit_cli.hotset.rerank import RerankReport

StrengthOpt = Annotated[
    str,
    typer.Option("--strength", metavar="<float>|inf|auto|auto-layer",
                 help="Prior weight of REF in tokens: a number, `inf` (REF alone), `auto` (one "
                 "empirical-Bayes strength for all layers) or `auto-layer` (one per layer)."),
]
HotFracOpt = Annotated[
    float,
    typer.Option("--hot-frac", help="Without --recipe/--hot-gib: report hot-set changes when this fraction of "
                 "all experts is hot (equal sizes)."),
]


def rerank_cmd(
    ref_file: Annotated[Path, typer.Argument(metavar="REF", help="Reference histogram (hotsplit.hist/1).")],
    mine_file: Annotated[Path, typer.Argument(metavar="MINE", help="Histogram of a sample of my traffic.")],
    output: OutOpt = None,
    strength: StrengthOpt = "auto",
    recipe: RecipeOpt = None,
    hot_gib: HotGibOpt = None,
    hot_frac: HotFracOpt = 0.25,
    json: JsonOpt = False,
) -> None:
    """Re-rank REF for my traffic: a Dirichlet prior from REF, updated with MINE's counts."""
    out = Output(json)
    req = RerankRequest(ref_file, mine_file, strength, hot_frac)
    if hot_gib is not None and recipe is None:
        raise UsageError("--hot-gib needs --recipe to know the expert sizes", "pass --recipe NAME")
    rec = knobs = None
    if recipe is not None:
        rec = load_recipe(recipe)
        knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib})
    report = rerank_files(req, rec, knobs, out.warn)
    if output is not None:
        save_hist(output, report.result.hist)
    out.emit(report.to_doc(output), lambda: _render(out, report))
    if output is not None:
        out.note(f"wrote {output}")


def _render(out: Output, report: RerankReport) -> None:
    """The human report of a `RerankReport`: the strength, per layer REF's weight, the hot-set changes."""
    h, change = report.result.hist, report.change
    out.print(f"re-ranked {report.ref_path} for {report.mine_path}: strength {report.strength_text()}, "
              f"{report.result.strength_source}")
    t = out.table("layer", "MINE tokens", "REF weight", "spearman REF/MINE", "hot changed")
    for row in report.to_doc(None)["layers"]:
        rho = row["spearman_ref_mine"]
        t.add_row(str(row["layer"]), f"{row['mine_assignments'] / h.top_k:.0f}", pct(row["ref_weight"]),
                  "-" if rho is None else f"{rho:+.3f}", str(row["hot_changed"]))
    out.print(t)
    out.print(f"at {report.budget_desc}: {change.changed} of {change.hot_experts} hot experts change vs REF's plan")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("rerank")(rerank_cmd)
