"""What `hotsplit place` computes: a placement fitted on a histogram's windows (or totals), and
its balance next to the baseline layouts (trivial, random, totals-only EPLB), on the fitted
histogram and optionally on a later one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe, recipe_file
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.placement.algorithm import Geometry, Placement, check_geometry, place_experts
from hotsplit_cli.placement.evaluate import (
    FitChoice,
    choose_fit,
    duplicate_count,
    eplb_layout,
    evaluate,
    random_layout,
    trivial_layout,
)
from hotsplit_cli.placement.file import placement_doc, sglang_doc
from hotsplit_cli.placement.held_out import held_out_balance
from hotsplit_cli.traffic.hist import Histogram, load_hist
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe

FILE_KEYS = ("phy2log", "log2phy", "logcnt")  # the maps: in the file, not in the report


@dataclass(frozen=True)
class PlaceRequest:
    hist_path: Path
    ranks: int
    redundant: int = 0  # redundant physical experts per layer
    nodes: int = 1
    groups: int | None = None  # expert groups; default the recipe's n_group, else nodes
    eval_path: Path | None = None  # a later histogram to compare the layouts on
    seed: int = 0  # of the random layout
    fit: str = "auto"  # windows | totals | auto
    platform_path: Path | None = None  # platform.json: time each rank (hotset/placetime.py)
    balance: str = "time"  # with a platform: the layout written, tokens | time (docs/placement.md)
    plan_path: Path | None = None  # with a platform: a plan's budget and stored precisions (hotset/placetime.py)


@dataclass(frozen=True)
class PlaceReport:
    request: PlaceRequest
    hist: Histogram
    geometry: Geometry
    windows: int  # windows in the fitted histogram
    fit: FitChoice
    placement: Placement
    doc: dict  # the placement.json document
    compare: dict  # layout name -> {"fitted": balance, "duplicate_ranks": n[, "eval": balance]}
    times: dict | None = None  # with a platform: each layout's predicted rank times (hotset/placetime.py)
    later: Histogram | None = None  # the --eval histogram, loaded and checked once

    def file_doc(self, fmt: str, recipe: Recipe | None) -> dict:
        """The document `-o` writes: hotsplit.placement/1, or SGLang's one row per model layer."""
        if fmt == "sglang":
            return sglang_doc(self.placement, recipe.model.num_hidden_layers, self.hist.num_experts)
        return self.doc

    def to_doc(self, output: Path | None, fmt: str) -> dict:
        doc = {"placement": {k: v for k, v in self.doc.items() if k not in FILE_KEYS},
               "output": str(output) if output else None, "format": fmt, "compare": self.compare,
               "eval": str(self.request.eval_path) if self.request.eval_path else None}
        if self.times is not None:
            doc["times"] = self.times
        return doc


def hist_windows(hist: Histogram) -> np.ndarray:
    return hist.windows_WLE if hist.windows_WLE is not None else hist.counts_LE[None]


def place_from_hist(req: PlaceRequest, recipe: Recipe | None = None,
                    warn: Callable[[str], None] = lambda message: None) -> PlaceReport:
    """Fit a placement on `req.hist_path` and compare it with the baseline layouts; `warn(message)`
    is told each warning as it arises (a histogram that names another model than the recipe)."""
    hist = load_hist(req.hist_path)
    E = hist.num_experts
    if recipe is not None:
        for warning in check_hist_matches_recipe(hist, recipe, req.hist_path):
            warn(warning)
    groups, nodes = req.groups, max(req.nodes, 1)
    if groups is None:
        groups = recipe.model.n_group if recipe is not None and recipe.model.n_group % nodes == 0 else nodes
    geo = Geometry(req.ranks, req.redundant, req.nodes, groups)
    check_geometry(E, geo)
    if req.redundant:  # warned once the geometry is known to be valid
        warn(f"each of the {req.redundant} redundant replicas per layer takes an expert's bytes on its rank: under a "
             f"hot budget they leave room for fewer distinct hot experts (`hotsplit plan --placement` says how many)")
    later = None
    if req.eval_path is not None:
        later = load_hist(req.eval_path)
        if later.num_experts != E or tuple(later.layers) != tuple(hist.layers):
            raise PlanError(f"{req.eval_path}: layers {list(later.layers)} x {later.num_experts} experts do not "
                            f"match {req.hist_path} ({list(hist.layers)} x {E})",
                            "evaluate on a histogram of the same model")
    all_W = hist_windows(hist)
    choice = choose_fit(all_W, hist.layers, geo, req.fit)
    placement = place_experts(all_W if choice.mode == "windows" else hist.counts_LE[None], hist.layers, geo)
    compare = compare_layouts(hist, later, geo, placement, req.seed)
    source = {"histogram": str(req.hist_path), "model": hist.model, "recipe": recipe.name if recipe else None,
              **({"recipe_path": path} if recipe and (path := recipe_file(recipe)) else {}),
              "windows": int(all_W.shape[0]), "fit": choice.to_doc(),
              "num_redundant": req.redundant, "num_groups": groups, "steps_per_window": hist.steps_per_window}
    held = held_out_balance(all_W, lambda w_WLE: place_experts(
        w_WLE if choice.mode == "windows" else w_WLE.sum(axis=0, keepdims=True), hist.layers, geo))
    doc = placement_doc(placement, E, evaluate(all_W, placement), source, held.to_doc())
    return PlaceReport(req, hist, geo, int(all_W.shape[0]), choice, placement, doc, compare, later=later)


def compare_layouts(hist: Histogram, later: Histogram | None, geo: Geometry, placement: Placement,
                    seed: int = 0) -> dict:
    """Balance of the baselines and `placement` on every window of `hist` (and of `later`)."""
    E, all_W = hist.num_experts, hist_windows(hist)
    layouts = {
        "trivial": trivial_layout(E, hist.layers, geo),
        "random": random_layout(E, hist.layers, geo, seed),
        "totals-only": eplb_layout(hist.counts_LE, hist.layers, geo),
        "hotsplit": placement,
    }
    compare = {}
    for name, lay in layouts.items():
        row = {"fitted": evaluate(all_W, lay).to_doc(), "duplicate_ranks": duplicate_count(lay)}
        if later is not None:
            row["eval"] = evaluate(hist_windows(later), lay).to_doc()
        compare[name] = row
    return compare
