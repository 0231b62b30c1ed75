"""The hot set one rank serves with, from a plan file: a plan for another number of ranks, or
one that puts an expert hot where the placement holds no replica of it, is refused by name."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.rank_hot_set import hot_set_of_plan
from hotsplit_cli.placement.dispatch import contiguous_placement


@dataclass
class FakePlan:
    """What hot_set_of_plan reads of a PlanFile."""

    hot_by_rank: list
    hit_rate: float = 0.5
    budget_bytes: int = 1000
    made_from: str | None = None
    rank_hit_rates: list = field(default_factory=list)

    def hot_LE(self, layers, num_experts, rank=0, model=None):
        return self.hot_by_rank[rank]


RECIPE = load_recipe("tiny")
L, E = RECIPE.model.num_moe_layers, RECIPE.model.num_experts
PLACED = contiguous_placement(RECIPE.model.moe_layer_ids, E, 2)  # rank 1 holds the upper half


def test_one_rank_takes_the_plan_hot_set_its_bytes_and_origin():
    hot = np.zeros((L, E), bool)
    hot[:, :2] = True
    got = hot_set_of_plan(FakePlan([hot]), "p.json", RECIPE, 10)
    assert got.hot_LE is hot and got.hot_bytes == 20 * L and got.budget_bytes is None
    assert got.made_from == "p.json (it records no histogram)" and got.source == "p.json"


def test_an_ep_rank_takes_its_own_hot_set_and_expected_hit_rate():
    hot = np.zeros((L, E), bool)
    hot[:, E - 1] = True
    got = hot_set_of_plan(FakePlan([np.zeros((L, E), bool), hot], rank_hit_rates=[0.1, 0.7]), "p.json", RECIPE,
                          10, PLACED, rank=1)
    assert got.hot_LE is hot and got.rank_hit_rate == 0.7 and got.budget_bytes == 1000


def test_a_plan_for_another_number_of_ranks_is_refused():
    with pytest.raises(PlanError, match=r"p.json: a plan for 1 ranks; this run has 2"):
        hot_set_of_plan(FakePlan([np.zeros((L, E), bool)]), "p.json", RECIPE, 10, PLACED, rank=0)


def test_a_hot_expert_the_placement_puts_elsewhere_is_refused_naming_it():
    hot = np.zeros((L, E), bool)
    hot[0, E - 1] = True  # rank 0 holds the lower half only
    with pytest.raises(PlanError, match=rf"rank 0 is to hold expert {E - 1} of layer "
                                        rf"{RECIPE.model.moe_layer_ids[0]} hot, but the placement puts no replica"):
        hot_set_of_plan(FakePlan([hot, hot]), "p.json", RECIPE, 10, PLACED, rank=0)
