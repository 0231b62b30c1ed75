"""One expert-parallel rank: its `Rank` value (`ep_rank`) and its part of the one loop. Tokens are
data-parallel (a trace's steps cut into token shards, synthetic traffic drawn per rank), experts
expert-parallel by the placement; the loop (`Engine.run` with `RankLoop`) steps every rank in
lockstep and gathers each window's figures to rank 0."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotsplit_cli.hotset.planfile import PlanFile
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import ReplicaMap

from ..engine import LoopHooks
from ..ranks import Rank, settle_device
from ..request import RunRequest
from .interrupt import job_stops
from .launch import Group
from .shared_bank import SharedAllocator, shm_prefix
from .summary import RankTotals


def ep_rank(request: RunRequest, group: Group, placement: Placement, plan_file: PlanFile | None) -> Rank:
    """This process's rank of the job: each rank its own GPU when the node has one per rank, else
    the device requested; the node's shared cold bank (filled by its local rank 0)."""
    recipe, knobs = request.recipe, request.knobs
    device = recipe.run.device
    if group.backend == "nccl" and device in ("auto", "cuda"):
        device = f"cuda:{group.local_rank}"
    platform, info, numa = settle_device(device, knobs, request.platform)
    allocator = SharedAllocator(pin=info.pinned, numa=numa, prefix=shm_prefix(group.job, group.node),
                                creator=group.local_rank == 0)
    return Rank(group.rank, group.world, info, numa, allocator, platform, plan_file, group, placement,
                ReplicaMap.of(placement, recipe.model.num_experts), knobs.ep_exchange)


class RankLoop(LoopHooks):
    """A rank's part of the one loop: every `eplb_steps` steps `rebalancer.maybe(step)` (a collective);
    at every window the ranks agree whether Ctrl-C stops the job there (no rank stops alone)."""

    stops_alone = False

    def __init__(self, control, eplb_steps: int, rebalancer=None):
        self.control, self.eplb_steps, self.rebalancer = control, eplb_steps, rebalancer

    def stops_at_window(self) -> bool:
        return job_stops(self.control)

    def after_step(self, step: int, steps: int) -> None:
        if self.rebalancer is None:
            return
        self.rebalancer.after_step(step)
        if self.eplb_steps and step % self.eplb_steps == 0 and step < steps:
            self.rebalancer.maybe(step)

    def finish(self) -> None:
        if self.rebalancer is not None:
            self.rebalancer.finish()


def run_rank(engine, steps: int, on_window: Callable, rebalancer=None,
             expected_hit_rate: float | None = None) -> RankTotals:
    """Step in lockstep through the one loop, calling `on_window(record, loads_WL)` on every rank as
    each window closes; `expected_hit_rate`: of this rank's hot set on its placed experts."""
    stats = engine.model.exchange.stats
    start = 0

    def on_record(rec):
        nonlocal start
        on_window(rec, np.asarray(stats.loads[start:], dtype=np.int64))
        start = len(stats.loads)
    hooks = RankLoop(engine.model.exchange.control, engine.knobs.eplb_steps, rebalancer)
    summary = engine.run(steps, on_record, hooks=hooks)
    loads_SL = np.asarray(stats.loads, dtype=np.int64).reshape(-1, engine.model.num_layers)
    return RankTotals(summary, loads_SL, engine.book.cold_reads, expected_hit_rate, stats.act_bytes,
                      stats.meta_bytes, stats.ms, stats.exchanges)
