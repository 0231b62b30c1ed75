"""The hot set a rank serves with: the plan file read here (once, unless the caller has read it),
the choice made by the planning library (hotsplit_cli/hotset/rank_hot_set.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.rank_hot_set import PlanChoice, hot_set_of_plan, planned_hot_set

from .ranks import Rank


def choose_hot_set(rank: Rank, recipe: Recipe, counts_LE: np.ndarray, expert_bytes: int,
                   plan_path: str | Path | None, budget: Callable, traffic: str) -> PlanChoice:
    """The hot set `rank` serves with, and the hit rate it is expected to reach; `budget()` gives
    the hot budget when the set is planned here, `traffic` names what `counts_LE` came from."""
    if plan_path is not None:
        plan = rank.plan_file or load_plan(plan_path)
        return hot_set_of_plan(plan, plan_path, recipe, expert_bytes, rank.placement, rank.rank)
    return planned_hot_set(counts_LE, expert_bytes, budget().budget_bytes, traffic, rank.placement, rank.rank)
