"""One expert-parallel rank: its context for `prepare_run` (EPRankContext) and its loop hooks.

Tokens are data-parallel: a trace's step is cut into the ranks' token shards
(`hotsplit_cli.placement.dispatch.token_shard`), synthetic traffic and generated hidden states
are drawn per rank (the recipe's seed offset by the rank). Experts are expert-parallel: the
placement (a plan's recorded `hotsplit.placement/1` file, else the contiguous layout) says which
rank holds which replica; each rank's hot set is chosen among the experts placed on it (the
plan's `ranks[r]`, else planned here by `plan_on_placement`, the code `plan --placement` runs).

The one loop (`Engine.run`, with this module's `RankLoop` hooks) steps every rank in lockstep
(each step's exchanges are collectives), closes a window every `dyn_steps` steps on every rank
(dynamic swaps are per rank, as on one rank), and gathers each window's figures to rank 0,
which prints for the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.planfile import PlanFile, load_plan, plan_on_placement
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import ReplicaMap, placed_hit_rates

from ..engine import LoopHooks
from ..rank_context import PlanChoice, RankContext, plan_from_file
from .checkpoint import EPCheckpoint, Lockstep
from .dispatch import AllGather, AllToAll, EPMoE, make_exchange
from .interrupt import job_stops
from .launch import Group
from .shared_bank import SharedAllocator, shm_prefix
from .summary import RankTotals


class EPRankContext(RankContext):
    """An expert-parallel rank's answers to `prepare_run` (runtime/rank_context.py)."""

    use_graph = False  # an EP step exchanges over the network, sized on the host: no CUDA graph

    def __init__(self, group: Group, placement: Placement, num_experts: int, plan_file: PlanFile | None = None,
                 exchange_mode: str = "a2a"):
        super().__init__(plan_file)
        self.group, self.placement, self.rank, self.world = group, placement, group.rank, group.world
        self.exchange_mode = exchange_mode  # the ep_exchange knob
        self.replicas = ReplicaMap.of(placement, num_experts)
        self.exchange: AllToAll | AllGather | None = None
        self.allocator: SharedAllocator | None = None

    def check_recipe(self, recipe) -> None:
        """The job checked the recipe before its ranks started."""

    def device(self, request: str) -> str:
        """Each rank its own GPU when the node has one per rank, else the one requested."""
        if self.group.backend == "nccl" and request in ("auto", "cuda"):
            return f"cuda:{self.group.local_rank}"
        return request

    def plan(self, recipe, counts_LE: np.ndarray, expert_bytes: int, plan_path, budget: Callable,
             traffic: str) -> PlanChoice:
        """This rank's hot set among the experts placed on it, and what it is expected to serve."""
        if plan_path is not None:
            pf = self.plan_file or load_plan(plan_path)
            if len(pf.hot_by_rank) != self.world:
                raise PlanError(f"{plan_path}: a plan for {len(pf.hot_by_rank)} ranks; this run has {self.world}",
                                "plan with a recipe of the same ep")
            choice = plan_from_file(pf, plan_path, recipe, expert_bytes, rank=self.rank, with_budget=True)
            self._check_placed(choice.hot_LE, plan_path)
            rank_rate = pf.rank_hit_rates[self.rank] if pf.rank_hit_rates else None
            return dataclasses.replace(choice, rank_hit_rate=rank_rate)
        b = budget().budget_bytes
        p = plan_on_placement(counts_LE, self.placement, expert_bytes, b)
        return PlanChoice(p.hot_RLE[self.rank], p.hit_rate, f"planned from {traffic}", b,
                          int(p.hot_bytes_R[self.rank]), traffic,
                          float(placed_hit_rates(counts_LE, self.placement, p.hot_RLE)[self.rank]))

    def _check_placed(self, hot_LE: np.ndarray, plan_path) -> None:
        held = self.held_LE()
        bad = np.argwhere(hot_LE & ~held)
        if len(bad):
            li, e = bad[0]
            raise PlanError(f"{plan_path}: rank {self.rank} is to hold expert {e} of layer "
                            f"{self.placement.layers[li]} hot, but the placement puts no replica of it there",
                            "plan with --placement on the placement this run uses")

    def held_LE(self) -> np.ndarray:
        """bool [L, E]: the logical experts with a replica on this rank."""
        return self.replicas.held_LE(self.rank)

    def _make_exchange(self) -> AllToAll | AllGather:
        self.exchange = make_exchange(self.exchange_mode, self.replicas, self.rank, self.world,
                                      control=self.group.control)
        return self.exchange

    def build_model(self, layers, geom, hot_LE, setup, compute):
        """The rank's model over the node's shared cold bank (`_on_shared_bank`)."""
        exchange, info = self._make_exchange(), setup.info
        model = self._on_shared_bank(setup.numa, info, lambda allocator: EPMoE(layers, geom, hot_LE, info, allocator,
                                                                               compute, exchange=exchange))
        return self.allocator, model

    def _on_shared_bank(self, numa, info, build: Callable):
        """`build(allocator)` over the node's shared cold bank: local rank 0 creates and fills it,
        then the node's other ranks map it; once all have, its files are unlinked."""
        g = self.group
        allocator = SharedAllocator(pin=info.pinned, numa=numa, prefix=shm_prefix(g.job, g.node),
                                    creator=g.local_rank == 0)
        if allocator.creator:
            built = build(allocator)
            g.barrier()
        else:
            g.barrier()
            built = build(allocator)
        g.barrier()
        allocator.unlink()
        self.allocator = allocator
        return built

    # ---- a checkpoint's rank ----

    def pooled(self, counts_LE: np.ndarray) -> np.ndarray:
        """Collective: every rank's routing counts summed (exact integers in float64)."""
        import torch
        import torch.distributed as dist

        total = torch.from_numpy(np.asarray(counts_LE, dtype=np.float64).copy())
        dist.all_reduce(total, group=self.group.control)
        return total.numpy()

    def load_checkpoint(self, path, setup):
        """The checkpoint over the node's shared cold bank: its experts read from the files once
        per node (by the rank that fills the bank), every other tensor by every rank."""
        from ..hf.loader import load_model

        hm = self._on_shared_bank(setup.numa, setup.info,
                                  lambda allocator: load_model(path, setup.info, allocator=allocator))
        return hm, self.allocator

    def checkpoint_model(self, hm, info, generation):
        """The checkpoint's experts through the exchange, and the generation in lockstep."""
        model = EPCheckpoint(hm, info, self._make_exchange(), self.group.control)
        return model, Lockstep(generation, model)


class RankLoop(LoopHooks):
    """A rank's part of the one loop (runtime/engine.py `Engine.run`): every `eplb_steps` steps
    `rebalancer.maybe(step)` (a collective); at every window the ranks agree whether Ctrl-C
    stops the job there (interrupt.py): a rank cannot stop alone in the middle of collectives."""

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
    """Step in lockstep with the other ranks through the one loop; at every window's close call
    `on_window(record, loads_WL)` on every rank (it gathers to rank 0), with the window's loads.
    `expected_hit_rate`: of this rank's hot set on its placed experts."""
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
