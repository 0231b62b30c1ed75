"""Two decisions every command and the runtime share: the hot budget per rank, and the rate at
which cold experts are read. One rule each, one wording of where the value came from.

Hot budget, the first that applies:
1. a plan's own budget (`simulate --plan`): every policy is compared at the budget its hot set
   was made for, and a --hot-gib that says otherwise is refused;
2. the `hot_gib` knob: --hot-gib > HOTSPLIT_HOT_GIB > recipe hotsplit.hot_gib;
3. derived ("auto"): GPU memory - dense weights - KV cache - reserve, never more than the bank,
   where GPU memory is the smallest probed free memory of platform.json's GPUs, else (no
   platform.json, or one probed without a GPU: its rates still count) the recipe's
   hardware.gpu_mem_gib, said so.

Cold read rate, the first that applies: with platform.json, the slowest GPU's zero-copy read,
else the host's memory copy rate (no GPU measured); without one, the recipe's
hardware.pcie_gbps (not measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.recipe import GIB, Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.sizes import BudgetDerivation, derive_hot_budget, over_gpu

if TYPE_CHECKING:
    from hotsplit_cli.config.platform_file import PlatformInfo

RECIPE_GPU_MEM = "recipe hardware.gpu_mem_gib"
ZERO_COPY = "slowest GPU's zero-copy read"


class BudgetedPlan(Protocol):
    """What the budget rule reads of a plan file (planfile.PlanFile): its path and recorded budget;
    a protocol so that this module does not import planfile, which imports it."""

    path: Path
    budget_bytes: int | None


@dataclass(frozen=True)
class HotBudget:
    """The hot budget of one rank and where it came from."""

    budget_bytes: int  # int(hot_gib * GIB), or the plan's own bytes
    hot_gib: float  # as given or derived (GiB)
    source: str  # flag | env | recipe | auto | plan
    origin: str  # as the user reads it: --hot-gib, HOTSPLIT_HOT_GIB, recipe hotsplit.hot_gib, auto, plan PATH
    derivation: BudgetDerivation | None = None  # every term, when derived
    over_gpu: str | None = None  # why a given budget does not fit next to what stays on the GPU

    def explain(self) -> str:
        """One line: the derivation with every term, or the budget and where it was given."""
        if self.derivation is not None:
            return self.derivation.explain()
        return f"hot budget {gib(self.budget_bytes)} per rank (from {self.origin})"


def probed_free_gib(platform: PlatformInfo | None) -> float | None:
    """The smallest free memory (GiB) of platform.json's GPUs; None without a measured one."""
    free = [g.mem_free_bytes for g in platform.gpus if g.mem_free_bytes is not None] if platform else []
    return min(free) / GIB if free else None


def resolve_hot_budget(recipe: Recipe, knobs: Knobs, platform: PlatformInfo | None = None,
                       plan: BudgetedPlan | None = None) -> HotBudget:
    """The hot budget per rank by the rule of this module. A plan that records no budget takes
    --hot-gib; a platform.json without a measured free GPU memory cannot derive one."""
    given = _budget_given(knobs)
    if plan is not None and not (plan.budget_bytes is None and given):
        return _plan_budget(knobs, plan, given)
    free_gib = probed_free_gib(platform)
    mem_source = RECIPE_GPU_MEM if free_gib is None else f"{platform.path}: smallest free GPU memory"
    if platform is not None and free_gib is None:
        mem_source = f"{RECIPE_GPU_MEM}: {platform.path} has no GPU with a measured free memory"
    if knobs.hot_gib is not None:
        return HotBudget(int(knobs.hot_gib * GIB), knobs.hot_gib, knobs.sources["hot_gib"], knobs.origin("hot_gib"),
                         over_gpu=over_gpu(recipe, knobs.hot_gib, knobs.vram_reserve_gib, free_gib, mem_source))
    derivation = derive_hot_budget(recipe, knobs.vram_reserve_gib, free_gib, mem_source)
    return HotBudget(int(derivation.hot_gib * GIB), derivation.hot_gib, "auto", "auto", derivation)


def _budget_given(knobs: Knobs) -> bool:
    """The user asked for a budget (--hot-gib or HOTSPLIT_HOT_GIB), not the recipe or the default."""
    return knobs.sources["hot_gib"] in ("flag", "env") and knobs.hot_gib is not None


def _plan_budget(knobs: Knobs, plan: BudgetedPlan, given: bool) -> HotBudget:
    budget = plan.budget_bytes
    if budget is None:
        raise UsageError(f"{plan.path}: records no `budget_bytes`",
                         "pass --hot-gib, or re-create the plan with `hotsplit plan`")
    if given and int(knobs.hot_gib * GIB) != budget:
        where = knobs.origin("hot_gib")
        raise UsageError(f"{where} {knobs.hot_gib:g} disagrees with the budget of {plan.path} "
                         f"({budget / GIB:g} GiB)", f"drop {where}: a --plan brings its own budget")
    return HotBudget(budget, budget / GIB, "plan", f"plan {plan.path}")


def check_plan_budget(knobs: Knobs, plan: BudgetedPlan) -> None:
    """`run --plan` takes the plan's hot set as it is: a budget the user asked for (--hot-gib,
    HOTSPLIT_HOT_GIB) must be the plan's own, never silently ignored."""
    if not _budget_given(knobs):
        return
    if plan.budget_bytes is None:
        where = knobs.origin("hot_gib")
        raise UsageError(f"{where} {knobs.hot_gib:g} with --plan {plan.path}: the plan's hot set is used as it is, "
                         "and it records no budget to check against", f"drop {where}, or re-plan with it")
    _plan_budget(knobs, plan, True)


@dataclass(frozen=True)
class ReadRate:
    """The rate cold experts are read at (GB/s, 1e9 B/s) and where it came from; None when
    nothing gives one. `h2d_gbps`: the slowest GPU's host->device copy (swaps), when measured."""

    gbps: float | None
    source: str | None
    h2d_gbps: float | None = None

    @property
    def zero_copy_gbps(self) -> float | None:
        """The rate when it is a GPU's measured zero-copy read of pinned host memory, else None."""
        return self.gbps if self.source == ZERO_COPY else None


def choose_read_rate(recipe: Recipe, platform: PlatformInfo | None = None) -> ReadRate:
    """The cold read rate by the rule of this module; the slowest GPU bounds a TP step."""
    if platform is not None:
        reads = [g.zero_copy_read_gbps for g in platform.gpus if g.zero_copy_read_gbps]
        copies = [g.h2d_gbps for g in platform.gpus if g.h2d_gbps]
        h2d = min(copies) if copies else None
        if reads:
            return ReadRate(min(reads), ZERO_COPY, h2d)
        return ReadRate(platform.host_copy_gbps, "host memory copy (no GPU measured)", h2d)
    if recipe.hardware.pcie_gbps:
        return ReadRate(recipe.hardware.pcie_gbps, "recipe hardware.pcie_gbps, not measured")
    return ReadRate(None, None)
