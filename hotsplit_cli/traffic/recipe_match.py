"""Does a histogram belong to a recipe's model: one check for every command that takes both
(plan, simulate, place, rerank, ledger, hist show)."""

from __future__ import annotations

import os

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.traffic.hist import Histogram


def check_hist_matches_recipe(hist: Histogram, recipe: Recipe, where: str | os.PathLike | None = None) -> list[str]:
    """Refuse a histogram whose shape is not the recipe's model's (experts per layer, MoE layer
    ids); return warnings for what the shape cannot tell: a histogram that names another model."""
    m, what = recipe.model, str(where or "histogram")
    if hist.num_experts != m.num_experts:
        raise PlanError(
            f"{what}: {hist.num_experts} experts per layer but recipe {recipe.name!r} has {m.num_experts}",
            "use the recipe of the model the histogram was captured on",
        )
    unknown = [x for x in hist.layers if x not in m.moe_layer_ids]
    if unknown:
        raise PlanError(
            f"{what}: layer {unknown[0]} is not a MoE layer of recipe {recipe.name!r} "
            f"(MoE layers {m.moe_layer_ids[0]}..{m.moe_layer_ids[-1]})",
            "check the recipe, or re-import the histogram with --recipe",
        )
    if _same_model(hist.model, recipe):
        return []
    return [f"{what}: a histogram of model {hist.model!r}, but recipe {recipe.name!r} is {m.name!r} "
            "(same shape: used as given; is it the right histogram?)"]


def _same_model(hist_model: str, recipe: Recipe) -> bool:
    """Names match by their last path part, ignoring case (a checkpoint folder `DeepSeek-V3` is
    `deepseek-ai/DeepSeek-V3`); a histogram imported without a recipe names no model."""
    def key(name: str) -> str:
        return name.strip().rstrip("/").rsplit("/", 1)[-1].lower()

    return key(hist_model) in ("", "unknown", key(recipe.model.name), key(recipe.name))
