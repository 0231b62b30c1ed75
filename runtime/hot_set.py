"""The hot set a rank serves with: read from a plan file, or planned on the routing counts the
rank was built with. One rank plans on all the experts; an expert-parallel rank among the
experts its placement puts on it (the code `plan --placement` runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.planfile import PlanFile, load_plan, plan_on_placement
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.placement.dispatch import placed_hit_rates

from .ranks import Rank


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


def choose_hot_set(rank: Rank, recipe: Recipe, counts_LE: np.ndarray, expert_bytes: int,
                   plan_path: str | Path | None, budget: Callable, traffic: str) -> PlanChoice:
    """The hot set `rank` serves with, and the hit rate it is expected to reach; `budget()` gives
    the hot budget when the set is planned here, `traffic` names what `counts_LE` came from."""
    if plan_path is not None:
        return _from_file(rank, rank.plan_file or load_plan(plan_path), plan_path, recipe, expert_bytes)
    b = budget().budget_bytes
    if rank.placement is None:
        p = plan_hot_set(counts_LE, expert_bytes, b)
        return PlanChoice(p.hot_RLE[0], p.hit_rate, f"planned from {traffic}", b, int(p.hot_bytes_R[0]), traffic)
    p = plan_on_placement(counts_LE, rank.placement, expert_bytes, b)
    return PlanChoice(p.hot_RLE[rank.rank], p.hit_rate, f"planned from {traffic}", b,
                      int(p.hot_bytes_R[rank.rank]), traffic,
                      float(placed_hit_rates(counts_LE, rank.placement, p.hot_RLE)[rank.rank]))


def _from_file(rank: Rank, plan: PlanFile, path, recipe: Recipe, expert_bytes: int) -> PlanChoice:
    """Rank `rank`'s hot set [L, E], the plan's expected hit rate and its origin, from a
    `hotsplit.plan/1` file. An EP rank's plan is for the job's ranks and reports its budget (a
    single rank's summary never has) and the rank's own expected hit rate."""
    m = recipe.model
    if rank.placement is not None and len(plan.hot_by_rank) != rank.world:
        raise PlanError(f"{path}: a plan for {len(plan.hot_by_rank)} ranks; this run has {rank.world}",
                        "plan with a recipe of the same ep")
    hot_LE = plan.hot_LE(m.moe_layer_ids, m.num_experts, rank=rank.rank, model=recipe.name)
    made_from = plan.made_from or f"{path} (it records no histogram)"
    if rank.placement is None:
        return PlanChoice(hot_LE, plan.hit_rate, str(path), None, int(hot_LE.sum()) * expert_bytes, made_from)
    _check_placed(rank, hot_LE, path)
    return PlanChoice(hot_LE, plan.hit_rate, str(path), plan.budget_bytes, int(hot_LE.sum()) * expert_bytes,
                      made_from, plan.rank_hit_rates[rank.rank] if plan.rank_hit_rates else None)


def _check_placed(rank: Rank, hot_LE: np.ndarray, plan_path) -> None:
    bad = np.argwhere(hot_LE & ~rank.replicas.held_LE(rank.rank))
    if len(bad):
        li, e = bad[0]
        raise PlanError(f"{plan_path}: rank {rank.rank} is to hold expert {e} of layer "
                        f"{rank.placement.layers[li]} hot, but the placement puts no replica of it there",
                        "plan with --placement on the placement this run uses")
