"""One expert-parallel rank: its part of `prepare_run` (RankHooks) and its run loop.

Tokens are data-parallel: a trace's step is cut into the ranks' token shards
(`hotsplit_cli.placement.dispatch.token_shard`), synthetic traffic and generated hidden states
are drawn per rank (the recipe's seed offset by the rank). Experts are expert-parallel: the
placement (a plan's recorded `hotsplit.placement/1` file, else the contiguous layout) says which
rank holds which replica; each rank's hot set is chosen among the experts placed on it (the
plan's `ranks[r]`, else planned here by `plan_on_placement`, the code `plan --placement` runs).

The run loop steps every rank in lockstep (each step's exchanges are collectives), closes a
window every `dyn_steps` steps on every rank (dynamic swaps are per rank, as on one rank), and
gathers each window's figures to rank 0, which prints for the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.planfile import PlanFile, load_plan, plan_on_placement
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.dispatch import ReplicaMap, contiguous_placement, placed_hit_rates, token_shard
from hotsplit_cli.traffic.trace import Trace

from ..engine import ArraySource
from ..from_recipe import PlanChoice
from .dispatch import AllGather, AllToAll, EPMoE, make_exchange
from .interrupt import job_stops
from .launch import Group
from .shared_bank import SharedAllocator, shm_prefix

SEED_STRIDE = 1_000_003  # rank r draws its tokens from seed + r * SEED_STRIDE


def placement_of_plan(plan: PlanFile, layers, num_experts: int, ep: int) -> Placement:
    """The placement an EP plan was made on (its recorded file, unchanged), else the contiguous
    layout. One-line errors when the file is gone, changed, or does not fit the recipe."""
    from hotsplit_cli.placement.file import load_placement
    from hotsplit_cli.traffic.hist import file_sha256

    if plan.placement is None:
        return contiguous_placement(layers, num_experts, ep)
    where = plan.placement["path"]
    try:
        sha = file_sha256(where)
    except OSError:
        raise PlanError(f"{plan.path}: its placement {where} cannot be read",
                        "keep the placement beside the plan (or where it was), or re-plan with --placement") from None
    if plan.placement.get("sha256") not in (None, sha):
        raise PlanError(f"{plan.path}: its placement {where} changed since the plan was made",
                        "re-plan with `hotsplit plan --placement`")
    placement = load_placement(where)
    if placement.num_ranks != ep or tuple(placement.layers) != tuple(layers):
        raise PlanError(f"{plan.path}: its placement {where} spreads layers {list(placement.layers)[:3]}... over "
                        f"{placement.num_ranks} ranks; the recipe has ep={ep} and MoE layers {list(layers)[:3]}...",
                        "place and plan for this recipe")
    return placement


class RankHooks:
    """What `runtime.from_recipe.prepare_run` asks of an expert-parallel rank."""

    def __init__(self, group: Group, placement: Placement, num_experts: int, plan_file: PlanFile | None = None,
                 exchange_mode: str = "a2a"):
        self.group, self.placement = group, placement
        self.exchange_mode = exchange_mode  # the ep_exchange knob
        self.plan_file = plan_file  # the --plan file, read once by the job
        self.replicas = ReplicaMap.of(placement, num_experts)
        self.exchange: AllToAll | AllGather | None = None
        self.allocator: SharedAllocator | None = None
        self.expected_rank_hit_rate: float | None = None
        self.trace: Trace | None = None  # the replayed trace, for the job's prediction

    @property
    def rank(self) -> int:
        return self.group.rank

    def device(self, request: str) -> str:
        """Each rank its own GPU when the node has one per rank, else the one requested."""
        if self.group.backend == "nccl" and request in ("auto", "cuda"):
            return f"cuda:{self.group.local_rank}"
        return request

    def seed(self, seed: int) -> int:
        return seed + self.rank * SEED_STRIDE

    def shard_trace(self, trace: Trace) -> ArraySource:
        """This rank's tokens of every trace step."""
        self.trace = trace
        T = int(trace.topk_ids_SLTK.shape[2])
        shard = token_shard(T, self.group.world, self.rank)

        def gen():
            for s in range(trace.num_steps):
                w = None if trace.topk_weights_SLTK is None else trace.topk_weights_SLTK[s][:, shard]
                yield trace.topk_ids_SLTK[s][:, shard], w
        return ArraySource("trace", shard.stop - shard.start, gen(), trace.num_steps)

    def plan(self, counts_LE: np.ndarray, expert_bytes: int, plan_path, budget: Callable, traffic: str) -> PlanChoice:
        """This rank's hot set among the experts placed on it, and what it is expected to serve."""
        L, E = counts_LE.shape
        if plan_path is not None:
            pf = self.plan_file or load_plan(plan_path)
            if len(pf.hot_by_rank) != self.group.world:
                raise PlanError(f"{plan_path}: a plan for {len(pf.hot_by_rank)} ranks; this run has {self.group.world}",
                                "plan with a recipe of the same ep")
            hot_LE = pf.hot_LE(self.placement.layers, E, rank=self.rank)
            self._check_placed(hot_LE, plan_path)
            self.expected_rank_hit_rate = pf.rank_hit_rates[self.rank] if pf.rank_hit_rates else None
            return PlanChoice(hot_LE, pf.hit_rate, str(plan_path), pf.budget_bytes, int(hot_LE.sum()) * expert_bytes,
                              pf.made_from or f"{plan_path} (it records no histogram)")
        b = budget().budget_bytes
        p = plan_on_placement(counts_LE, self.placement, expert_bytes, b)
        self.expected_rank_hit_rate = float(placed_hit_rates(counts_LE, self.placement, p.hot_RLE)[self.rank])
        return PlanChoice(p.hot_RLE[self.rank], p.hit_rate, f"planned from {traffic}", b,
                          int(p.hot_bytes_R[self.rank]), traffic)

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
        return self.placement.held_LE(self.rank, int(self.replicas.logcnt_LE.shape[1]))

    def build_model(self, layers, geom, hot_LE, info, numa, compute):
        """The rank's model over the node's shared cold bank: local rank 0 creates and fills it,
        then the node's other ranks map it; once all have, its files are unlinked."""
        g = self.group
        allocator = SharedAllocator(shm_prefix(g.job, g.node), creator=g.local_rank == 0, numa=numa, pin=info.pinned)
        self.exchange = make_exchange(self.exchange_mode, self.replicas, g.rank, g.world, control=g.control)

        def build():
            return EPMoE(layers, geom, hot_LE, info, allocator, compute, exchange=self.exchange)
        if allocator.creator:
            model = build()
            g.barrier()
        else:
            g.barrier()
            model = build()
        g.barrier()
        allocator.unlink()
        model.held_LE = self.held_LE()
        self.allocator = allocator
        return allocator, model


@dataclass
class RankRun:
    """What a rank's loop leaves: its summary, its window records, its exchange totals."""

    summary: object  # runtime.windows.RunSummary
    loads_SL: np.ndarray  # int64 [steps, L] assignments received


def run_rank(engine, steps: int, on_window: Callable, rebalancer=None) -> RankRun:
    """Step in lockstep with the other ranks; every `dyn_steps` steps close a window here and
    call `on_window(record, loads_WL)` on every rank (it gathers to rank 0); every `eplb_steps`
    steps `rebalancer.maybe(step)` (a collective). Ctrl-C stops every rank at the same window
    (interrupt.py): a rank cannot stop alone in the middle of collectives."""
    import time

    dyn, eplb = engine.knobs.dyn_steps, engine.knobs.eplb_steps
    stats = engine.model.exchange.stats
    t0 = time.perf_counter()
    start, interrupted = 0, False
    for routed in engine.source.steps():
        if engine.step_count >= steps:
            break
        engine.step(routed)
        if engine.step_count % dyn == 0:
            rec = engine.close_window(update=engine.knobs.dynamic)
            on_window(rec, np.asarray(stats.loads[start:], dtype=np.int64))
            start = len(stats.loads)
            if job_stops(engine.model.exchange.control):  # Ctrl-C: every rank stops at this window
                interrupted = True
                break
        if rebalancer is not None:  # after the window's swaps, so they are decided on the map they served
            rebalancer.after_step(engine.step_count)
            if eplb and engine.step_count % eplb == 0 and engine.step_count < steps:
                rebalancer.maybe(engine.step_count)
    elapsed = time.perf_counter() - t0
    if rebalancer is not None:
        rebalancer.finish()
    engine.book.landed(engine.model.publish_ready(wait=True)[1])
    if engine.step_count > engine.book.window_start:
        rec = engine.close_window(update=False)
        on_window(rec, np.asarray(stats.loads[start:], dtype=np.int64))
    summary = engine.book.summary(engine.step_count, engine.step_count * engine.source.tokens_per_step, elapsed,
                                  engine.expected_hit_rate, interrupted)
    split = getattr(engine.model.compute, "split", None)
    if split is not None:
        summary.cold_paths = split.report(engine.expert_bytes, engine.model.banks[0].expert_bytes)
    return RankRun(summary, np.asarray(stats.loads, dtype=np.int64).reshape(-1, engine.model.num_layers))
