"""One rank of a run, as a value settled before anything is allocated: which rank (and the group
and placement of an expert-parallel job), its device, seed, cold bank allocator and platform
file. `Rank.single` is the one-rank run; an EP rank is settled by distributed/rank.py `ep_rank`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.planfile import PlanFile
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import ReplicaMap, token_shard
from hotsplit_cli.traffic.trace import Trace

from .cold_split import FP8_REFUSAL
from .device import DeviceInfo, choose_device
from .engine import ArraySource
from .pinned import NumaPolicy, PinnedAllocator, numa_policy_for

SEED_STRIDE = 1_000_003  # rank r draws its tokens from seed + r * SEED_STRIDE


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    info: DeviceInfo
    numa: NumaPolicy
    allocator: object  # the cold bank's: a PinnedAllocator, or an EP node's SharedAllocator
    platform: object | None = None  # the --platform file's contents
    plan_file: PlanFile | None = None  # the --plan file, when the caller has read (and checked) it already
    group: object | None = None  # an EP job's distributed/launch.py Group
    placement: Placement | None = None  # an EP job's: which rank holds which replica
    replicas: ReplicaMap | None = None  # the placement's replica map
    exchange_mode: str = "a2a"  # the ep_exchange knob

    @classmethod
    def single(cls, recipe: Recipe, knobs: Knobs, platform_path: str | Path | None = None,
               plan_file: PlanFile | None = None) -> Rank:
        """The one rank of a run without expert parallelism (refused for an EP recipe)."""
        if recipe.parallel.ep > 1:
            raise UsageError(f"parallel.ep is {recipe.parallel.ep}: an expert-parallel recipe runs on its ranks",
                             "run it with `hotsplit run` (it starts the ranks) or under torchrun")
        platform, info, numa = settle_device(recipe.run.device, knobs, platform_path)
        return cls(0, 1, info, numa, PinnedAllocator(pin=info.pinned, numa=numa), platform, plan_file)

    @property
    def use_graph(self) -> bool | None:
        """None: where the device has CUDA graphs; an EP step exchanges over the network, sized on
        the host: no CUDA graph."""
        return None if self.world == 1 else False

    def seed(self, seed: int) -> int:
        return seed + self.rank * SEED_STRIDE

    def check_fp8(self, recipe: Recipe, knobs: Knobs, kept: Callable[[DeviceInfo], bool]) -> None:
        """Refuse fp8 banks a CPU cold path would compute; `kept(info)`: whether the banks would
        hold fp8 experts on this rank's device."""
        if recipe.model.expert_dtype == "fp8" and knobs.cold_path != "gpu" and kept(self.info):
            raise UsageError(FP8_REFUSAL.format(mode=knobs.cold_path))

    def shard_trace(self, trace: Trace) -> ArraySource:
        """This rank's tokens of every trace step (one rank: all of them)."""
        shard = token_shard(int(trace.topk_ids_SLTK.shape[2]), self.world, self.rank)

        def gen():
            for s in range(trace.num_steps):
                w = None if trace.topk_weights_SLTK is None else trace.topk_weights_SLTK[s][:, shard]
                yield trace.topk_ids_SLTK[s][:, shard], w
        return ArraySource("trace", shard.stop - shard.start, gen())

    def share(self, prompts: list) -> list:
        """The prompts this rank generates: a contiguous share, the first len mod R ranks one
        more (one rank: all); the job's texts are the ranks' in rank order."""
        return prompts[token_shard(len(prompts), self.world, self.rank)]

    def on_bank(self, build: Callable):
        """`build(allocator)` over this rank's cold bank. An EP node's bank is shared: local rank 0 creates
        and fills it, the others then map it, and once all have its files are unlinked."""
        g = self.group
        if g is None:
            return build(self.allocator)
        if self.allocator.creator:
            built = build(self.allocator)
            g.barrier()
        else:
            g.barrier()
            built = build(self.allocator)
        g.barrier()
        self.allocator.unlink()
        return built


def settle_device(request: str, knobs: Knobs, platform_path) -> tuple[object | None, DeviceInfo, NumaPolicy]:
    """(the platform file read once, before the work; the device; where the cold bank goes)."""
    platform = load_platform(platform_path) if platform_path is not None else None
    info = choose_device(request)
    return platform, info, numa_policy_for(knobs.numa_policy, info.numa_node, info.reasons.get("numa_node"))


def single_rank(model, source, rank: Rank):
    """The parallelism of a one-rank run: none (distributed/apply.py `expert_parallel` is the other)."""
    return model, source
