"""The file an export reads, checked against the target and the recipe before anything is built:
the right kind for the engine (a plan or a placement), the recipe it was made for, and, for a
plan, the histogram its hit rates are predicted on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe, load_recipe
from hotsplit_cli.core.errors import InputFileError, PlanError, UsageError
from hotsplit_cli.core.jsonio import read_json, sniff_kind
from hotsplit_cli.hotset.planfile import PlanFile, load_plan
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.file import load_placement
from hotsplit_cli.traffic.hist import Histogram, file_sha256, load_hist

MAKES = {"plan": "`hotsplit plan HIST --recipe R -o plan.json`", "placement": "`hotsplit place HIST --ranks N -o "
         "placement.json`"}


@dataclass(frozen=True)
class PlanSource:
    path: Path
    plan: PlanFile
    recipe: Recipe
    hist: Histogram  # the routing the plan was made from: the hit rates are predicted on it
    hot_RLE: np.ndarray  # bool [ranks, MoE layers, E]: each rank's hot set, rows in the recipe's MoE layer order


@dataclass(frozen=True)
class PlacementSource:
    path: Path
    placement: Placement
    recipe: Recipe
    num_experts: int


def check_kind(path: Path, kind: str, engine: str) -> None:
    """InputFileError unless `path` is a `hotsplit.<kind>` file (the kind `engine` takes)."""
    doc = read_json(path)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != f"hotsplit.{kind}/1":
        what = sniff_kind(path) or "not a hotsplit file"
        raise InputFileError(f"{path}: is {what.split(' (')[0]}; --to {engine} takes a hotsplit.{kind} file",
                             f"make one with {MAKES[kind]}")


def read_plan_source(path: Path, engine: str, recipe_name: str | None, hist_path: Path | None) -> PlanSource:
    check_kind(path, "plan", engine)
    plan = load_plan(path)
    recipe = _recipe_for(path, plan.recipe, recipe_name)
    m = recipe.model
    hot = np.stack([plan.hot_LE(m.moe_layer_ids, m.num_experts, rank=r, model=recipe.name)
                    for r in range(len(plan.hot_by_rank))])
    if tuple(plan.layers) != tuple(m.moe_layer_ids):
        raise PlanError(f"{path}: the plan covers MoE layers {list(plan.layers)[:4]}..., recipe {recipe.name!r} has "
                        f"{list(m.moe_layer_ids)[:4]}...", "export the plan with the recipe it was made for")
    hist = _plan_hist(path, hist_path)
    if tuple(hist.layers) != tuple(m.moe_layer_ids) or hist.num_experts != m.num_experts:
        raise PlanError(f"{hist_path or 'the plan histogram'}: {hist.num_layers} layers x {hist.num_experts} "
                        f"experts, recipe {recipe.name!r} has {m.num_moe_layers} x {m.num_experts}",
                        "pass the histogram the plan was made from with --hist")
    return PlanSource(path, plan, recipe, hist, hot)


def read_placement_source(path: Path, engine: str, recipe_name: str | None) -> PlacementSource:
    check_kind(path, "placement", engine)
    placement = load_placement(path)
    num_experts = int(read_json(path)["num_experts"])
    if recipe_name is None:
        raise UsageError(f"--to {engine} numbers the layers as the model does and needs --recipe",
                         "pass the recipe of the placement's model, e.g. --recipe deepseek-v3-ep8")
    recipe = load_recipe(recipe_name)
    m = recipe.model
    if num_experts != m.num_experts or tuple(placement.layers) != tuple(m.moe_layer_ids):
        raise PlanError(f"{path}: a placement of {len(placement.layers)} layers x {num_experts} experts (layers "
                        f"{list(placement.layers)[:3]}...), recipe {recipe.name!r} has {m.num_moe_layers} MoE "
                        f"layers x {m.num_experts} experts (layers {list(m.moe_layer_ids)[:3]}...)",
                        "pass the recipe of the model the placement was fitted for")
    return PlacementSource(path, placement, recipe, num_experts)


def _recipe_for(path: Path, planned_with: str | None, recipe_name: str | None) -> Recipe:
    """The recipe the plan names, or --recipe; both given, they must be the same recipe."""
    if recipe_name is None and planned_with is None:
        raise UsageError(f"{path}: the plan names no recipe", "pass --recipe NAME")
    recipe = load_recipe(recipe_name or planned_with)
    if planned_with is not None and recipe.name != planned_with:
        raise PlanError(f"{path}: a plan for recipe {planned_with!r}, not {recipe.name!r}",
                        f"pass --recipe {planned_with}, or plan for {recipe.name!r} with `hotsplit plan`")
    return recipe


def _plan_hist(path: Path, hist_path: Path | None) -> Histogram:
    """--hist, else the histogram the plan names when it is still there with the same bytes."""
    if hist_path is not None:
        return load_hist(hist_path)
    doc = read_json(path).get("histogram") or {}
    named = doc.get("path")
    for candidate in ([Path(named), path.parent / named] if isinstance(named, str) else []):
        if candidate.is_file() and file_sha256(candidate) == doc.get("sha256"):
            return load_hist(candidate)
    raise InputFileError(f"{path}: the histogram the plan was made from ({named}) is not there or has changed; "
                         f"the hit rates are predicted on it", "pass it with --hist HIST")
