"""A synthetic run at a stored precision (the `precision` knob): what its recipe, geometry and
banks become when its routed experts are stored at fp8 or mxfp4 rather than natively, or at the
precision an auto plan chose for each expert (`auto_layers`, `store_layer`).

The recipe a run plans and counts with says the stored precision (`expert_dtype`), so its plan,
hit accounting and cold bytes count stored bytes; its geometry keeps mxfp4's 32-input groups
whole when `--scale` shrinks it; its banks hold the quantised experts on every device, the CPU
included (the torch path dequantises each expert as it computes it).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.planfile import AUTO_NEEDS_PLAN, PlanFile, stored_sizes
from hotsplit_cli.hotset.windows import StoredLayers

from .moe import LayerWeights, MoEGeometry
from .precision import MX_GROUP, StoredFormat, check_precision_dims, stored_format

SCALED_MULTIPLE = 8  # what scaled dims are rounded to otherwise (hotsplit_cli/hotset/sizes.py scaled_dim)


class StoredRun(NamedTuple):
    recipe: Recipe  # expert_dtype: the stored precision (native: the recipe's own)
    geom: MoEGeometry  # allocated, scaled
    banks: StoredFormat | None  # what the banks store (None: the recipe's own way)


def stored_run(recipe: Recipe, precision: str, scale: float) -> StoredRun:
    """The recipe, geometry and bank format of a run storing its experts at `precision`;
    UsageError where mxfp4's groups of 32 inputs do not divide the expert's dims."""
    if precision == "auto":  # each expert at its plan's precision: whole groups of 32 for any mxfp4 among them
        return StoredRun(recipe, MoEGeometry.from_recipe(recipe, scale, MX_GROUP), None)
    fmt = stored_format(precision)
    if fmt is None:
        return StoredRun(recipe, MoEGeometry.from_recipe(recipe, scale), None)
    stored = stored_recipe(recipe, precision)
    multiple = MX_GROUP if precision == "mxfp4" else SCALED_MULTIPLE
    return StoredRun(stored, MoEGeometry.from_recipe(stored, scale, multiple), fmt)


def stored_recipe(recipe: Recipe, precision: str) -> Recipe:
    """The recipe whose `expert_dtype` says the stored precision (native: the recipe as it is), so
    that its plan and byte counts are the stored bytes; UsageError where mxfp4's groups of 32
    inputs do not divide the expert's dims."""
    if precision == "native":
        return recipe
    m = recipe.model
    check_precision_dims(precision, m.hidden_size, m.moe_intermediate_size // recipe.parallel.tp,
                         f"recipe {recipe.name!r}")
    return dataclasses.replace(recipe, model=dataclasses.replace(m, expert_dtype=precision))


def run_auto_layers(recipe: Recipe, knobs: Knobs, plan: PlanFile | None) -> StoredLayers | None:
    """Under precision auto, each expert's precision and stored bytes from the run's auto plan (the
    command checked that it fits the recipe: hotset/planfile.py check_run_inputs); None otherwise."""
    if knobs.precision != "auto":
        return None
    if plan is None:
        raise UsageError(AUTO_NEEDS_PLAN.format(where=knobs.origin("precision")),
                         "pass --plan made with `hotsplit plan --precision auto --max-error E`")
    return auto_layers(plan, recipe)


def auto_layers(plan: PlanFile, recipe: Recipe) -> StoredLayers:
    """Each expert's precision and real stored bytes [L, E] under an auto plan (rows: the recipe's
    MoE layers); the one-line reason when the recipe's shape cannot take one of them."""
    m = recipe.model
    return StoredLayers(plan.precision_LE(m.moe_layer_ids, m.num_experts), stored_sizes(plan, recipe, m.moe_layer_ids))


def describe_auto(auto: StoredLayers) -> str:
    """How an auto plan stores the routed experts, for people: how many at each precision."""
    names, n = np.unique(auto.precision_LE.astype(str), return_counts=True)
    return "auto: " + ", ".join(f"{k} {p}" for p, k in zip(names, n, strict=True))


def store_layer(lw: LayerWeights, precision_E: np.ndarray, dtype: torch.dtype) -> None:
    """Store one layer's experts at their precisions (str [E]), in place: one format for the layer
    as `stored`, else one (ids, stored experts or None for native) part per precision present.
    `w13_EIH` / `w2_EHI` then hold the dequantised values, what the reference computes with.
    Each expert is quantised on its own (blocks and groups never span experts), so quantising a
    subset equals quantising all and taking the subset."""
    names = sorted(set(map(str, precision_E)))
    parts = []
    for name in names:
        ids = np.flatnonzero(np.asarray(precision_E) == name)
        fmt = stored_format(name)
        q = None if fmt is None else fmt.quantize_experts(lw.w13_EIH[ids], lw.w2_EHI[ids])
        if q is not None:
            lw.w13_EIH[ids], lw.w2_EHI[ids] = q.dequantized(dtype)
        parts.append((ids, q))
    if len(parts) == 1:
        lw.stored = parts[0][1]
    else:
        lw.parts = parts
