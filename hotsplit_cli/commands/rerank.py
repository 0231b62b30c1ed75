"""`hotsplit rerank REF MINE -o OUT`: a reference histogram re-ranked for my traffic."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ..errors import UsageError
from ..hist import load_hist, save_hist
from ..options import HotGibOpt, JsonOpt, OutOpt, RecipeOpt
from ..output import Output, gib, pct

StrengthOpt = Annotated[
    str,
    typer.Option("--strength", help="Prior weight of REF in tokens: a number, `inf` (REF alone), `auto` (one "
                 "empirical-Bayes strength for all layers) or `auto-layer` (one per layer)."),
]
HotFracOpt = Annotated[
    float,
    typer.Option("--hot-frac", help="Without --recipe/--hot-gib: report hot-set changes when this fraction of "
                 "all experts is hot (equal sizes)."),
]


def parse_strength(text: str) -> tuple[float | None, str]:
    """`auto` / `auto-layer` / `inf` / a number of tokens >= 0 -> (tokens or None, mode)."""
    t = text.strip().lower()
    if t in ("auto", "auto-shared"):
        return None, "shared"
    if t == "auto-layer":
        return None, "layer"
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"--strength: must be a number of tokens, inf, auto or auto-layer, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise UsageError(f"--strength: must be >= 0 tokens, got {text!r}")
    return value, "shared"


def _strength_doc(a: float, top_k: int):
    return None if math.isinf(a) else a / top_k


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
    from ..rerank import hot_change, rerank

    out = Output(json)
    tokens, mode = parse_strength(strength)
    if not 0 < hot_frac <= 1:
        raise UsageError(f"--hot-frac: must be in (0, 1], got {hot_frac}")
    if hot_gib is not None and recipe is None:
        raise UsageError("--hot-gib needs --recipe to know the expert sizes", "pass --recipe NAME")
    rec = None
    if recipe is not None:
        from ..knobs import resolve_knobs
        from ..recipe import GIB, load_recipe
        from ..sizes import expert_bytes_per_rank

        rec = load_recipe(recipe)
        knobs = resolve_knobs(rec.knobs, os.environ, {"hot_gib": hot_gib})
    ref = load_hist(ref_file)
    mine = load_hist(mine_file)
    if rec is not None:
        from ..planfile import check_hist_matches_recipe

        for path, hist in ((ref_file, ref), (mine_file, mine)):
            for warning in check_hist_matches_recipe(hist, rec, path):
                out.warn(warning)
    result = rerank(ref, mine, tokens, mode)
    h = result.hist
    if rec is not None and knobs.hot_gib is not None:
        size = expert_bytes_per_rank(rec)
        budget = int(knobs.hot_gib * GIB)
        budget_desc = f"{gib(budget)} per rank ({rec.name}, expert {gib(size)})"
    else:
        size = 1
        budget = max(1, int(hot_frac * h.num_layers * h.num_experts))
        budget_desc = f"{budget} of {h.num_layers * h.num_experts} experts hot ({100 * hot_frac:g}%, equal sizes)"
    change = hot_change(ref.counts_LE, h.counts_LE, size, budget)
    if output is not None:
        save_hist(output, h)
    finite = result.strength_L[np.isfinite(result.strength_L)]
    doc = {
        "ref": str(ref_file),
        "mine": str(mine_file),
        "output": str(output) if output is not None else None,
        "strength_source": result.strength_source,
        "layers": [
            {
                "layer": int(layer),
                "strength_tokens": _strength_doc(float(result.strength_L[i]), h.top_k),
                "ref_weight": float(result.ref_weight_L[i]),
                "mine_assignments": float(result.mine_assignments_L[i]),
                "spearman_ref_mine": result.spearman_L[i],
                "hot_changed": int(change.changed_L[i]),
            }
            for i, layer in enumerate(h.layers)
        ],
        "hot_budget": budget_desc,
        "hot_experts": change.hot_experts,
        "hot_changed": change.changed,
    }

    def render() -> None:
        if len(finite) == 0:
            s = "inf (MINE looks like a draw from REF: REF's ranking kept)"
        elif np.allclose(result.strength_L, result.strength_L[0]):
            s = f"{result.strength_L[0] / h.top_k:.4g} tokens"
        else:
            s = f"{np.median(finite) / h.top_k:.4g} tokens (median over layers)"
        out.print(f"re-ranked {ref_file} for {mine_file}: strength {s}, {result.strength_source}")
        t = out.table("layer", "MINE tokens", "REF weight", "spearman REF/MINE", "hot changed")
        for row in doc["layers"]:
            rho = row["spearman_ref_mine"]
            t.add_row(str(row["layer"]), f"{row['mine_assignments'] / h.top_k:.0f}", pct(row["ref_weight"]),
                      "-" if rho is None else f"{rho:+.3f}", str(row["hot_changed"]))
        out.print(t)
        out.print(f"at {budget_desc}: {change.changed} of {change.hot_experts} hot experts change vs REF's plan")

    out.emit(doc, render)
    if output is not None:
        out.note(f"wrote {output}")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("rerank")(rerank_cmd)
