"""The hot set one rank of a run serves with (numpy only): read from a plan file, or planned on
the routing counts the rank was built with. One rank plans on all the experts; an
expert-parallel rank among the experts its placement puts on it (the code `plan --placement`
runs). The runtime reads the plan file (runtime/hot_set.py) and builds the banks from this."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.planfile import PlanFile, plan_on_placement
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import placed_hit_rates


@dataclass(frozen=True)
class PlanChoice:
    hot_LE: np.ndarray  # bool [L, E]
    expected_hit_rate: float | None
    source: str  # "planned from <traffic>" | "<plan.json path>"
    budget_bytes: int | None
    hot_bytes: int  # real bytes
    made_from: str  # the routing the hot set was chosen on: this run's traffic, or a plan's histogram
    rank_hit_rate: float | None = None  # an EP rank's: of its hot set on the experts placed on it

    def to_doc(self, expert_bytes: int) -> dict:
        return {"source": self.source, "made_from": self.made_from, "expected_hit_rate": self.expected_hit_rate,
                "budget_bytes": self.budget_bytes, "hot_bytes": self.hot_bytes, "hot_experts": int(self.hot_LE.sum()),
                "expert_bytes": expert_bytes}


def planned_hot_set(counts_LE: np.ndarray, expert_bytes: int, budget_bytes: int, traffic: str,
                    placement: Placement | None = None, rank: int = 0) -> PlanChoice:
    """Rank `rank`'s hot set planned on `counts_LE` [L, E] (named `traffic`) under the budget;
    `placement`: an EP job's (None: one rank)."""
    source = f"planned from {traffic}"
    if placement is None:
        p = plan_hot_set(counts_LE, expert_bytes, budget_bytes)
        return PlanChoice(p.hot_RLE[0], p.hit_rate, source, budget_bytes, int(p.hot_bytes_R[0]), traffic)
    p = plan_on_placement(counts_LE, placement, expert_bytes, budget_bytes)
    return PlanChoice(p.hot_RLE[rank], p.hit_rate, source, budget_bytes, int(p.hot_bytes_R[rank]), traffic,
                      float(placed_hit_rates(counts_LE, placement, p.hot_RLE)[rank]))


def hot_set_of_plan(plan: PlanFile, path: str | Path, recipe: Recipe, expert_bytes: int,
                    placement: Placement | None = None, rank: int = 0) -> PlanChoice:
    """Rank `rank`'s hot set [L, E], the plan's expected hit rate and its origin, from the
    `hotsplit.plan/1` file at `path`. An EP rank's plan is for the job's ranks and reports its
    budget (a single rank's summary never has) and the rank's own expected hit rate."""
    m = recipe.model
    if placement is not None and len(plan.hot_by_rank) != placement.num_ranks:
        raise PlanError(f"{path}: a plan for {len(plan.hot_by_rank)} ranks; this run has {placement.num_ranks}",
                        "plan with a recipe of the same ep")
    hot_LE = plan.hot_LE(m.moe_layer_ids, m.num_experts, rank=rank, model=recipe.name)
    made_from = plan.made_from or f"{path} (it records no histogram)"
    if placement is None:
        return PlanChoice(hot_LE, plan.hit_rate, str(path), None, int(hot_LE.sum()) * expert_bytes, made_from)
    bad = np.argwhere(hot_LE & ~placement.held_LE(rank, m.num_experts))
    if len(bad):
        li, e = bad[0]
        raise PlanError(f"{path}: rank {rank} is to hold expert {e} of layer {placement.layers[li]} hot, but the "
                        "placement puts no replica of it there", "plan with --placement on the placement this run uses")
    return PlanChoice(hot_LE, plan.hit_rate, str(path), plan.budget_bytes, int(hot_LE.sum()) * expert_bytes,
                      made_from, plan.rank_hit_rates[rank] if plan.rank_hit_rates else None)
