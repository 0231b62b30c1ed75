"""A synthetic run at a stored precision (the `precision` knob): what its recipe, geometry and
banks become when its routed experts are stored at fp8 or mxfp4 rather than natively.

The recipe a run plans and counts with says the stored precision (`expert_dtype`), so its plan,
hit accounting and cold bytes count stored bytes; its geometry keeps mxfp4's 32-input groups
whole when `--scale` shrinks it; its banks hold the quantised experts on every device, the CPU
included (the torch path dequantises each expert as it computes it).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from hotsplit_cli.config.recipe import Recipe

from .moe import MoEGeometry
from .precision import MX_GROUP, StoredFormat, check_precision_dims, stored_format

SCALED_MULTIPLE = 8  # what scaled dims are rounded to otherwise (hotsplit_cli/hotset/sizes.py scaled_dim)


class StoredRun(NamedTuple):
    recipe: Recipe  # expert_dtype: the stored precision (native: the recipe's own)
    geom: MoEGeometry  # allocated, scaled
    banks: StoredFormat | None  # what the banks store (None: the recipe's own way)


def stored_run(recipe: Recipe, precision: str, scale: float) -> StoredRun:
    """The recipe, geometry and bank format of a run storing its experts at `precision`;
    UsageError where mxfp4's groups of 32 inputs do not divide the expert's dims."""
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
