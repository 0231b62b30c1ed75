"""The file an export reads, checked against the target and the recipe before anything is built:
the right kind for the engine (a plan or a placement), the recipe it was made for, and, for a
plan, the histogram its hit rates are predicted on (the one whose sha256 the plan records)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import RECIPES_DIR, Recipe, load_recipe
from hotsplit_cli.core.errors import HotsplitError, InputFileError, PlanError, UsageError
from hotsplit_cli.core.jsonio import read_json, sniff_kind
from hotsplit_cli.hotset.planfile import PlanFile, find_beside, load_plan
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.file import load_placement
from hotsplit_cli.traffic.hist import Histogram, file_sha256, load_hist

MAKES = {"plan": "`hotsplit plan HIST --recipe R -o plan.json`", "placement": "`hotsplit place HIST --ranks N "
         "--recipe R -o placement.json`"}


@dataclass(frozen=True)
class ExportRequest:
    path: Path
    engine: str
    output: Path
    recipe: str | None = None
    hist: Path | None = None  # the plan's histogram, when it moved
    online: int = 0  # trtllm: layers re-balanced per iteration

    @property
    def out(self) -> str:
        """The engine's file as its flags name it: absolute, so the line works from any folder."""
        return str(self.output.absolute())


@dataclass(frozen=True)
class PlanSource:
    path: Path
    plan: PlanFile
    recipe: Recipe
    hist: Histogram  # the routing the plan was made from: the hit rates are predicted on it
    hot_RLE: np.ndarray  # bool [ranks, MoE layers, E]: each rank's hot set, rows in the recipe's MoE layer order
    precision_LE: np.ndarray  # str [MoE layers, E]: each expert's stored precision (native, fp8 or mxfp4)


@dataclass(frozen=True)
class PlacementSource:
    path: Path
    placement: Placement
    recipe: Recipe
    num_experts: int


def check_kind(path: Path, kind: str, engine: str) -> dict:
    """The document of `path`; InputFileError unless it is a `hotsplit.<kind>` file (the kind
    `engine` takes)."""
    doc = read_json(path)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != f"hotsplit.{kind}/1":
        what = sniff_kind(path) or "not a hotsplit file"
        raise InputFileError(f"{path}: is {what.split(' (')[0]}; --to {engine} takes a hotsplit.{kind} file",
                             f"make one with {MAKES[kind]}")
    return doc


def read_plan_source(req: ExportRequest) -> PlanSource:
    path = req.path
    doc = check_kind(path, "plan", req.engine)
    plan = load_plan(path)
    recipe = _recipe_for(path, "plan", (plan.recipe, doc.get("recipe_path")), req.recipe, req.engine, doc.get("model"))
    m = recipe.model
    hot = np.stack([plan.hot_LE(m.moe_layer_ids, m.num_experts, rank=r, model=recipe.name)
                    for r in range(len(plan.hot_by_rank))])
    if tuple(plan.layers) != tuple(m.moe_layer_ids):
        raise PlanError(f"{path}: the plan covers MoE layers {list(plan.layers)[:4]}..., recipe {recipe.name!r} has "
                        f"{list(m.moe_layer_ids)[:4]}...", "export the plan with the recipe it was made for")
    hist = plan_hist(path, doc.get("histogram"), req.hist)
    if tuple(hist.layers) != tuple(m.moe_layer_ids) or hist.num_experts != m.num_experts:
        raise PlanError(f"{req.hist or 'the plan histogram'}: {hist.num_layers} layers x {hist.num_experts} "
                        f"experts, recipe {recipe.name!r} has {m.num_moe_layers} x {m.num_experts}",
                        "pass the histogram the plan was made from with --hist")
    return PlanSource(path, plan, recipe, hist, hot, plan.precision_LE(m.moe_layer_ids, m.num_experts))


def read_placement_source(req: ExportRequest) -> PlacementSource:
    path = req.path
    doc = check_kind(path, "placement", req.engine)
    placement = load_placement(path)
    num_experts = int(doc["num_experts"])
    made = doc.get("source") if isinstance(doc.get("source"), dict) else {}  # older files record neither
    recipe = _recipe_for(path, "placement", (made.get("recipe"), made.get("recipe_path")), req.recipe, req.engine,
                         made.get("model"))
    m = recipe.model
    if num_experts != m.num_experts or tuple(placement.layers) != tuple(m.moe_layer_ids):
        raise PlanError(f"{path}: a placement of {len(placement.layers)} layers x {num_experts} experts (layers "
                        f"{list(placement.layers)[:3]}...), recipe {recipe.name!r} has {m.num_moe_layers} MoE "
                        f"layers x {m.num_experts} experts (layers {list(m.moe_layer_ids)[:3]}...)",
                        "pass the recipe of the model the placement was fitted for")
    return PlacementSource(path, placement, recipe, num_experts)


def _recipe_for(path: Path, kind: str, recorded_as: tuple, given: str | None, engine: str, model: object) -> Recipe:
    """The recipe the file records (`recorded_as`: its name, and the path of a recipe YAML that is
    not shipped), or --recipe; both given, they must be the same recipe."""
    recorded, recorded_path = (x if isinstance(x, str) else None for x in recorded_as)
    if given is None and recorded is None:
        raise _no_recipe(path, kind, engine, model if isinstance(model, str) else None)
    if given is None and recorded_path is not None and not Path(recorded_path).is_file():
        raise UsageError(f"{path}: a {kind} made with recipe {recorded_path}, which is no longer there",
                         f"pass --recipe with that recipe's YAML ({recorded!r})")
    recipe = load_recipe(given or recorded_path or recorded)
    if recorded is not None and recipe.name != recorded:
        make = "plan" if kind == "plan" else "place"
        raise PlanError(f"{path}: a {kind} for recipe {recorded!r}, not {recipe.name!r}",
                        f"pass --recipe {recorded}, or {make} for {recipe.name!r} with `hotsplit {make}`")
    return recipe


def _no_recipe(path: Path, kind: str, engine: str, model: str | None) -> UsageError:
    """--recipe is missing and the file records none: name the file's model and its shipped recipes."""
    of = f"a {kind} of {model}" if model else f"a {kind} that names no model"
    names = shipped_recipes_of(model) if model else []
    hint = (f"pass the recipe of {model}: --recipe {' or --recipe '.join(names)}" if names else
            f"pass --recipe with the recipe YAML of {model or 'its model'}")
    return UsageError(f"--to {engine} numbers the layers as the model does and needs --recipe: {path} is {of} "
                      f"that records no recipe", hint)


def shipped_recipes_of(model: str) -> list[str]:
    """Names of the shipped recipes whose model is `model` (Hugging Face id)."""
    names = []
    for yaml_path in sorted(RECIPES_DIR.glob("*.yaml")):
        try:
            recipe = load_recipe(yaml_path)
        except HotsplitError:  # a shipped recipe that does not load is its own test's failure, not this hint's
            continue
        if recipe.model.name == model:
            names.append(recipe.name)
    return names


def plan_hist(path: Path, block: object, hist_path: Path | None) -> Histogram:
    """The histogram a plan was made from: --hist, else the file the plan's `histogram` block
    names, found where it was or beside the plan; either way its sha256 must be the one the plan
    records, or the hit rates would be predicted on other traffic."""
    block = block if isinstance(block, dict) else {}
    named, sha = block.get("path"), block.get("sha256")
    if hist_path is not None:
        got = file_sha256(hist_path) if hist_path.is_file() else None
        if got is not None and isinstance(sha, str) and got != sha:
            raise InputFileError(f"--hist {hist_path}: not the histogram {path} was made from ({named}, sha256 "
                                 f"{sha[:12]}..., this file {got[:12]}...); the plan's hit rates are predicted on "
                                 f"its own histogram", "pass the histogram the plan was made from, or re-plan on "
                                                       f"this one with `hotsplit plan {hist_path}`")
        return load_hist(hist_path)
    if isinstance(named, str):
        found = find_beside(path, named, sha if isinstance(sha, str) else None)
        if found.is_file() and (not isinstance(sha, str) or file_sha256(found) == sha):
            return load_hist(found)
    raise InputFileError(f"{path}: the histogram the plan was made from ({named}) is not there or has changed; "
                         f"the hit rates are predicted on it", "pass it with --hist HIST")
