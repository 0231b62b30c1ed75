"""Whether the cold banks fit in host memory: the page-locked bytes of one node (each routed
expert once per node, shared by the node's ranks) against the host memory the recipe
(`hardware.host_mem_gib`) or the probe (platform.json) gives. ledger and plan say so; run
refuses before allocating."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import GIB, ParallelSpec, Recipe
from hotsplit_cli.core.errors import RuntimeFailure
from hotsplit_cli.hotset.planfile import PlanFile, stored_sizes
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank

# Of the host memory the cold banks may pin. Page-locked memory cannot be swapped or reclaimed,
# and the rest of the process (torch, a checkpoint's page cache) needs room too.
HOST_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class HostFit:
    """The cold banks of one node against its host memory (bytes)."""

    bank_bytes: int  # page-locked, one node
    host_bytes: int
    source: str  # recipe hardware.host_mem_gib | <platform.json> host memory available

    @property
    def fits(self) -> bool:
        return self.bank_bytes <= HOST_MEMORY_SHARE * self.host_bytes

    def explain(self) -> str:
        return (f"the cold banks need {self.bank_bytes / GIB:.2f} GiB page-locked per node, above "
                f"{100 * HOST_MEMORY_SHARE:.0f}% of the {self.host_bytes / GIB:.2f} GiB host memory ({self.source})")

    def to_doc(self) -> dict:
        return {**dataclasses.asdict(self), "fits": self.fits, "share": HOST_MEMORY_SHARE}


def node_bank_bytes(recipe: Recipe, scale: float = 1.0, precision: str = "native") -> int:
    """Every routed expert once, whole (a node's ranks share its cold bank), at its stored
    `precision`; `scale` shrinks hidden and expert sizes as a scaled CPU run allocates them."""
    whole = dataclasses.replace(recipe, parallel=ParallelSpec(tp=1, ep=1))
    m = recipe.model
    return int(expert_bytes_per_rank(whole, precision) * m.num_experts * m.num_moe_layers * scale * scale)


def host_fit(recipe: Recipe, platform_path: str | Path | None = None, scale: float = 1.0,
             precision: str = "native", bank_bytes: int | None = None) -> HostFit | None:
    """The recipe's host memory when it gives one, else the probe's, against the banks at their
    stored `precision` (or `bank_bytes`, one node's, when experts differ: an auto plan's); None
    when neither gives one."""
    host, source = None, ""
    if recipe.hardware.host_mem_gib is not None:
        host, source = int(recipe.hardware.host_mem_gib * GIB), "recipe hardware.host_mem_gib"
    elif platform_path is not None:
        available = load_platform(platform_path).host_mem_available_bytes
        if available:
            host, source = available, f"{platform_path}: host memory available"
    banks = node_bank_bytes(recipe, scale, precision) if bank_bytes is None else bank_bytes
    return None if host is None else HostFit(banks, host, source)


def check_host_fits(recipe: Recipe, platform_path: str | Path | None, scale: float | None,
                    precision: str = "native", plan: PlanFile | None = None) -> None:
    """Refuse a run whose cold banks do not fit the host memory it was given, before allocating;
    at precision auto, each expert at the stored bytes its `plan` gives it."""
    scale = recipe.run.scale if scale is None else scale
    bank_bytes = None
    if precision == "auto" and plan is not None:
        whole = dataclasses.replace(recipe, parallel=ParallelSpec(tp=1, ep=1))
        bank_bytes = int(stored_sizes(plan, whole, recipe.model.moe_layer_ids).sum() * scale * scale)
    fit = host_fit(recipe, platform_path, scale, precision, bank_bytes)
    if fit is not None and not fit.fits:
        raise RuntimeFailure(fit.explain(), "use a host with more memory, more nodes, or a smaller --scale")
