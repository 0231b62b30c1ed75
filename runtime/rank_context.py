"""One rank's part of a run: what `prepare_run` and a checkpoint run ask of the rank they build.

A run is N ranks. `RankContext` is the single-rank default (N = 1, no process group): the
setup every run makes (`setup`: the platform file read once, the requested device, the refusal
of fp8 banks the CPU would compute, the NUMA policy; it allocates nothing), the recipe's seed,
every token of each step, a hot set planned on all the experts (or read from a plan file), a
private pinned cold bank, CUDA graphs where the device has them. An expert-parallel rank
(runtime/distributed/rank.py `EPRankContext`) answers the same questions for its share: its GPU,
its seed, its token shard, its hot set among the experts placed on it, the node-shared cold bank
and the exchange, no CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.planfile import PlanFile, load_plan
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.placement.dispatch import token_shard
from hotsplit_cli.traffic.trace import Trace

from .cold_split import FP8_REFUSAL
from .device import DeviceInfo, choose_device
from .engine import ArraySource
from .model import HotColdMoE
from .pinned import NumaPolicy, PinnedAllocator, numa_policy_for

SEED_STRIDE = 1_000_003  # rank r draws its tokens from seed + r * SEED_STRIDE


@dataclass
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


def plan_from_file(plan: PlanFile, path, recipe: Recipe, expert_bytes: int, rank: int = 0,
                   with_budget: bool = False) -> PlanChoice:
    """Rank `rank`'s hot set [L, E], the plan's expected hit rate and its origin, from a
    `hotsplit.plan/1` file: the one place a run takes its plan from a file. `with_budget`: report
    the plan's budget (an expert-parallel job reports it; a single rank's summary never has)."""
    m = recipe.model
    hot_LE = plan.hot_LE(m.moe_layer_ids, m.num_experts, rank=rank, model=recipe.name)
    return PlanChoice(hot_LE, plan.hit_rate, str(path), plan.budget_bytes if with_budget else None,
                      int(hot_LE.sum()) * expert_bytes, plan.made_from or f"{path} (it records no histogram)")


@dataclass
class RunSetup:
    platform: object | None  # the --platform file's contents, or None
    info: DeviceInfo
    numa: NumaPolicy  # where the cold bank goes

    def allocator(self) -> PinnedAllocator:  # private (an EP rank maps its node's shared bank)
        return PinnedAllocator(pin=self.info.pinned, numa=self.numa)


class RankContext:
    """The single-rank default; see the module docstring."""

    rank, world = 0, 1
    use_graph: bool | None = None  # None: where the device has CUDA graphs

    def __init__(self, plan_file: PlanFile | None = None):
        self.plan_file = plan_file  # the --plan file, when the caller has read (and checked) it already

    def check_recipe(self, recipe: Recipe) -> None:
        if recipe.parallel.ep > 1:
            raise UsageError(f"parallel.ep is {recipe.parallel.ep}: an expert-parallel recipe runs on its ranks",
                             "run it with `hotsplit run` (it starts the ranks) or under torchrun")

    def device(self, request: str) -> str:
        return request

    def setup(self, recipe: Recipe, knobs: Knobs, platform_path: str | Path | None,
              fp8_kept: Callable[[DeviceInfo], bool]) -> RunSetup:
        """`fp8_kept(info)`: whether the banks would hold fp8 experts on this rank's device."""
        platform = load_platform(platform_path) if platform_path is not None else None  # read once, before the work
        info = choose_device(self.device(recipe.run.device))
        if recipe.model.expert_dtype == "fp8" and knobs.cold_path != "gpu" and fp8_kept(info):
            raise UsageError(FP8_REFUSAL.format(mode=knobs.cold_path))
        return RunSetup(platform, info, numa_policy_for(knobs.numa_policy, info.numa_node,
                                                        info.reasons.get("numa_node")))

    def seed(self, seed: int) -> int:
        return seed + self.rank * SEED_STRIDE

    def shard_trace(self, trace: Trace) -> ArraySource:
        """This rank's tokens of every trace step (one rank: all of them)."""
        shard = token_shard(int(trace.topk_ids_SLTK.shape[2]), self.world, self.rank)

        def gen():
            for s in range(trace.num_steps):
                w = None if trace.topk_weights_SLTK is None else trace.topk_weights_SLTK[s][:, shard]
                yield trace.topk_ids_SLTK[s][:, shard], w
        return ArraySource("trace", shard.stop - shard.start, gen(), trace.num_steps)

    def plan(self, recipe: Recipe, counts_LE: np.ndarray, expert_bytes: int, plan_path: str | Path | None,
             budget: Callable, traffic: str) -> PlanChoice:
        """The hot set this rank serves with, and the hit rate it is expected to reach."""
        if plan_path is not None:
            return plan_from_file(self.plan_file or load_plan(plan_path), plan_path, recipe, expert_bytes)
        b = budget().budget_bytes
        p = plan_hot_set(counts_LE, expert_bytes, b)
        return PlanChoice(p.hot_RLE[0], p.hit_rate, f"planned from {traffic}", b, int(p.hot_bytes_R[0]), traffic)

    def build_model(self, layers, geom, hot_LE, setup: RunSetup, compute):
        """(cold bank allocator, model) of this rank."""
        allocator = setup.allocator()
        return allocator, HotColdMoE(layers, geom, hot_LE, setup.info, allocator, compute)

    # ---- a checkpoint's rank (runtime/hf/run.py) ----

    def share(self, prompts: list) -> list:
        """The prompts this rank generates: a contiguous share, the first len mod R ranks one
        more (one rank: all); the job's texts are the ranks' in rank order."""
        return prompts[token_shard(len(prompts), self.world, self.rank)]

    def pooled(self, counts_LE: np.ndarray) -> np.ndarray:
        """The job's routing counts from this rank's (one rank: its own)."""
        return counts_LE

    def load_checkpoint(self, path, setup: RunSetup):
        """(the loaded checkpoint, its cold bank's allocator)."""
        from .hf.loader import load_model

        allocator = setup.allocator()
        return load_model(path, setup.info, allocator=allocator), allocator

    def checkpoint_model(self, hm, info: DeviceInfo, generation):
        """(the loop's model, its routing source) over a loaded checkpoint and its generation."""
        from .hf.steps import CheckpointMoE

        return CheckpointMoE(hm, info), generation

