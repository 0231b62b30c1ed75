"""Whether the experts a layout keeps on one GPU fit in that GPU's memory at all.

A placement engine keeps every slot on its GPU: a layout whose expert bytes per rank exceed the
GPU's memory cannot load, whatever the dense weights and the KV cache need on top. Checked by
`place` (with a recipe) and by every `export`, against the recipe's `hardware.gpu_mem_gib`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hotsplit_cli.config.recipe import GIB, Recipe
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.placement.algorithm import Placement


@dataclass(frozen=True)
class GpuFit:
    expert_bytes: int  # GPU expert bytes of the busiest rank
    gpu_mem_bytes: int | None  # one GPU's memory; None: the recipe does not say (probe it)
    recipe: str

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_mem_bytes is None else self.expert_bytes <= self.gpu_mem_bytes

    def to_doc(self) -> dict:
        return {"expert_bytes": self.expert_bytes, "gpu_mem_bytes": self.gpu_mem_bytes, "fits": self.fits}

    def warning(self) -> str | None:
        """The one-line warning when the experts alone exceed the GPU; None when they fit or the
        GPU's memory is unknown."""
        if self.fits is not False:
            return None
        return (f"{gib(self.expert_bytes)} of GPU expert bytes per rank exceed the {gib(self.gpu_mem_bytes)} GPU of "
                f"recipe {self.recipe!r} (hardware.gpu_mem_gib), before dense weights and KV cache: the engine "
                f"cannot load this layout; spread it over more ranks or fewer redundant experts")


def gpu_fit(expert_bytes: int, recipe: Recipe) -> GpuFit:
    mem = recipe.hardware.gpu_mem_gib
    return GpuFit(int(expert_bytes), None if mem is None else int(mem * GIB), recipe.name)


def placement_expert_bytes(placement: Placement, recipe: Recipe) -> int:
    """Bytes of one rank's expert slots over every MoE layer: whole experts (EP does not slice them)."""
    whole = replace(recipe, parallel=replace(recipe.parallel, tp=1))
    return placement.slots_per_rank * len(placement.layers) * expert_bytes_per_rank(whole)
