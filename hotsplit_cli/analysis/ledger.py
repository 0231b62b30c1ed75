"""Memory and expert-parallel All-to-All ledgers of one deployment (numpy/stdlib only, no I/O).

Memory ledger, per rank: what must stay on the GPU (dense weights / tp, KV cache, reserve), what
is left for hot experts, and how many experts that holds out of the rank's bank.

All-to-All ledger for an expert-parallel group of N cards. Each card routes `tokens_per_step`
tokens per engine step; every token sends `top_k` activations of `hidden` elements to the cards
that own its experts (dispatch) and gets as many back (combine). Per MoE layer and card:

    message_bytes   = tokens_per_step x top_k x hidden x act_bytes          [B]
    remote_fraction = (N - 1) / N x cross_ratio                             [1]
    a2a_bytes       = 2 (dispatch + combine) x message_bytes x remote_fraction [B]
    a2a_ms          = a2a_bytes / (link_gbps x 1e9 B/s) x 1e3 ms/s          [ms]

(N - 1) / N is the share of a token's experts that live on other cards when routing ignores
placement; `cross_ratio` scales it (1.0 = placement-blind routing, < 1 when placement keeps
a token's experts on its own card). The estimate is a bandwidth bound: no latency, no overlap.

The other exchange (vLLM's default): every card all-gathers the tokens of all N cards and each
card's partial outputs (the assignments its experts served, weighted) are summed back to the
token's card by a reduce-scatter. Each card sends its tokens to the N - 1 others once, whatever
top_k and the placement, and as many partial rows back:

    ag_rs_bytes     = 2 (all-gather + reduce-scatter) x tokens_per_step x hidden x act_bytes x (N - 1) [B]

so ag_rs / a2a = N / (top_k x cross_ratio): the all-gather sends fewer bytes when top_k > N.

Step-time model: one engine step = `step_ms` of compute (given by the user, measured or
estimated) + the All-to-All of every MoE layer, not overlapped. Comm is flagged when it takes
more than 30% of that step.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.config.recipe import GIB, ParallelSpec, Recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.host_memory import HostFit
from hotsplit_cli.hotset.planner import contiguous_owner
from hotsplit_cli.hotset.sizes import (
    PRECISIONS,
    bank_bytes_per_rank,
    dense_bytes_per_rank,
    expert_bytes_per_rank,
    over_gpu,
    precision_bytes,
)
from hotsplit_cli.traffic.hist import Histogram
from hotsplit_cli.traffic.recipe_match import check_hist_matches_recipe

BYTES_PER_GB = 1e9  # link bandwidths are in GB/s = 1e9 B/s (not GiB)
MS_PER_S = 1e3
DEFAULT_ACT_BYTES = 2  # bf16 activations
DEFAULT_LINK_GBPS = 450.0  # NVLink 4 (H100/H200 SXM): 900 GB/s both ways = 450 GB/s each way
DEFAULT_CROSS_RATIO = 1.0
COMM_SHARE_LIMIT = 0.30  # flag comm above this share of step time
HOT_EXPERT_FACTOR = 2.0  # flag experts whose count is above this multiple of their layer mean


@dataclass(frozen=True)
class CommModel:
    """Assumptions of the All-to-All estimate; each one is printed next to the result."""

    tokens_per_step: int  # tokens each card routes per engine step
    act_bytes: int = DEFAULT_ACT_BYTES  # bytes per activation element
    link_gbps: float = DEFAULT_LINK_GBPS  # per card, per direction, GB/s (1e9 B/s)
    cross_ratio: float = DEFAULT_CROSS_RATIO  # multiplier on the placement-blind remote share
    step_ms: float | None = None  # compute time of one engine step without All-to-All (ms)


@dataclass(frozen=True)
class MemoryLedger:
    """Parameters, expert bytes and the per-rank GPU budget of one deployment."""

    total_params: float
    active_params: float | None
    routed_expert_params: int
    dense_params: float
    expert_dtype: str
    tp: int
    ep: int
    num_moe_layers: int
    num_experts: int  # routed experts per MoE layer
    expert_bytes: int | None  # one expert as one rank holds it (1/tp slice, + scales); None under auto
    expert_bytes_full: int | None  # one whole expert (tp = 1); None under auto
    bank_bytes_total: int  # every routed expert of the model, whole
    bank_bytes_per_rank: int  # the routed experts one rank is responsible for
    host_bytes_all_ranks: int  # page-locked host memory of every rank's cold bank together
    experts_per_rank: int  # (layer, expert) pairs one rank holds a share of
    gpu_mem_gib: float | None  # per GPU; None = unknown
    dense_gib: float  # non-expert weights per rank
    kv_cache_gib: float
    reserve_gib: float
    room_gib: float | None  # GPU - dense - KV - reserve (negative = does not fit)
    hot_gib: float | None  # the hot budget in use; None = unknown
    hot_source: str  # flag | env | recipe | auto | unknown
    hot_experts: int | None  # experts the hot budget holds on one rank
    hot_fraction: float | None  # hot_experts / experts_per_rank
    precision: str = "native"  # the stored precision every expert byte figure counts (sizes.PRECISIONS, or auto)
    # auto: per precision, one expert's bytes per rank and whole, and how many experts it stores
    # (expert_bytes and expert_bytes_full are then None: no one figure fits every expert)
    stored: dict[str, dict[str, int]] | None = None

    @property
    def ranks(self) -> int:
        return self.tp * self.ep

    def to_doc(self) -> dict:
        doc = {**dataclasses.asdict(self), "ranks": self.ranks}
        if self.stored is None:  # uniform ledgers keep their shape
            del doc["stored"]
        return doc


@dataclass(frozen=True)
class StoredExperts:
    """An auto plan's experts as the ledger counts them: each at the precision the plan chose."""

    precision_LE: np.ndarray  # str [L, E]: native, fp8 or mxfp4, rows the recipe's MoE layers
    hot_experts: int  # the plan's hot experts on rank 0

    def sizes_LE(self, recipe: Recipe) -> np.ndarray:
        """int64 [L, E]: each expert's stored bytes as one rank of `recipe` holds it."""
        table = precision_bytes(recipe)
        return np.array([[table[p] for p in row] for row in self.precision_LE], dtype=np.int64)

    def node_bank_bytes(self, recipe: Recipe) -> int:
        """Every routed expert once, whole, at its stored precision: one node's cold bank."""
        return int(self.sizes_LE(_whole(recipe)).sum())


@dataclass(frozen=True)
class A2ALedger:
    """Expert memory per card and All-to-All traffic for an EP group of `ep` cards."""

    ep: int
    tp: int
    experts_per_card: int  # routed experts per layer on one card
    expert_bytes_per_card: int  # every routed expert this card owns, all MoE layers
    tokens_per_step: int
    top_k: int
    hidden_size: int
    act_bytes: int
    message_bytes: int  # one direction, one MoE layer, all of a card's tokens
    remote_fraction: float  # (ep - 1) / ep x cross_ratio
    cross_ratio: float
    a2a_bytes_per_layer: float  # dispatch + combine bytes leaving one card
    link_gbps: float
    a2a_ms_per_layer: float
    ag_rs_bytes_per_layer: float  # the all-gather + reduce-scatter exchange: bytes leaving one card
    ag_rs_ms_per_layer: float
    num_moe_layers: int
    a2a_ms_per_step: float
    step_ms: float | None  # compute part of the step (user's estimate)
    comm_share: float | None  # a2a / (compute + a2a)

    def to_doc(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HotExpert:
    layer: int  # model layer index
    expert: int
    count: float
    layer_mean: float
    ratio: float  # count / layer_mean


@dataclass(frozen=True)
class Flag:
    kind: str  # hot_expert | comm_share | no_room | over_gpu | host_mem
    message: str


@dataclass(frozen=True)
class Ledger:
    recipe: str
    model: str
    memory: MemoryLedger
    comm: CommModel
    a2a: A2ALedger
    hot_experts: tuple[HotExpert, ...] | None  # None = no histogram given
    flags: tuple[Flag, ...]

    def to_doc(self) -> dict:
        return {
            "recipe": self.recipe,
            "model": self.model,
            "memory": self.memory.to_doc(),
            "assumptions": dataclasses.asdict(self.comm),
            "a2a": self.a2a.to_doc(),
            "hot_experts": None
            if self.hot_experts is None
            else [dataclasses.asdict(h) for h in self.hot_experts],
            "flags": [dataclasses.asdict(f) for f in self.flags],
        }


def with_ep(recipe: Recipe, ep: int) -> Recipe:
    """The same deployment with an expert-parallel size of `ep` (tp kept)."""
    if ep < 1:
        raise UsageError(f"--ep: must be >= 1, got {ep}")
    if recipe.model.num_experts % ep:
        raise UsageError(
            f"--ep: {ep} does not divide model.num_experts ({recipe.model.num_experts})",
            "pick an EP size that divides the expert count",
        )
    return dataclasses.replace(recipe, parallel=ParallelSpec(tp=recipe.parallel.tp, ep=ep))


def memory_ledger(
    recipe: Recipe, reserve_gib: float, hot_gib: float | None = None, hot_source: str = "auto",
    precision: str = "native", stored: StoredExperts | None = None,
) -> MemoryLedger:
    """Per-rank memory ledger, experts counted at their stored `precision`, or each at its own
    (`stored`: an auto plan's, whose hot set it counts). `hot_gib` None = auto: GPU - dense - KV -
    reserve, capped at the bank."""
    m, par, hw = recipe.model, recipe.parallel, recipe.hardware
    expert, expert_full, bank_rank, bank_total, host_all = _bank_bytes(recipe, precision, stored)
    experts_per_rank = m.num_experts // par.ep * m.num_moe_layers
    dense_gib = dense_bytes_per_rank(recipe) / GIB
    room = None
    if hw.gpu_mem_gib is not None:
        room = hw.gpu_mem_gib - dense_gib - hw.kv_cache_gib - reserve_gib
    if hot_gib is None and room is not None:
        hot_gib, hot_source = min(max(room, 0.0), bank_rank / GIB), "auto"
    elif hot_gib is None:
        hot_source = "unknown"
    hot_n = frac = None
    if stored is not None:  # the plan's own hot set, its experts of different sizes
        hot_n = stored.hot_experts
        frac = hot_n / experts_per_rank
    elif hot_gib is not None:
        # Whole experts only: a partly resident expert still reads the rest over PCIe.
        hot_n = min(int(hot_gib * GIB // expert), experts_per_rank)
        frac = hot_n / experts_per_rank
    return MemoryLedger(
        total_params=m.total_params,
        active_params=m.active_params,
        routed_expert_params=m.routed_expert_params,
        dense_params=m.dense_params,
        expert_dtype=m.expert_dtype,
        tp=par.tp,
        ep=par.ep,
        num_moe_layers=m.num_moe_layers,
        num_experts=m.num_experts,
        expert_bytes=expert,
        expert_bytes_full=expert_full,
        bank_bytes_total=bank_total,
        bank_bytes_per_rank=bank_rank,
        host_bytes_all_ranks=host_all,
        experts_per_rank=experts_per_rank,
        gpu_mem_gib=hw.gpu_mem_gib,
        dense_gib=dense_gib,
        kv_cache_gib=hw.kv_cache_gib,
        reserve_gib=reserve_gib,
        room_gib=room,
        hot_gib=hot_gib,
        hot_source=hot_source,
        hot_experts=hot_n,
        hot_fraction=frac,
        precision="auto" if stored is not None else precision,
        stored=None if stored is None else _stored_table(recipe, stored),
    )


def _bank_bytes(recipe: Recipe, precision: str, stored: StoredExperts | None) -> tuple:
    """(one expert per rank, one whole expert, a rank's bank, every expert whole, every rank's
    banks) in bytes; under an auto plan (`stored`) the two expert figures are None, a rank's bank
    is the largest rank's and every rank's banks are summed."""
    m, par = recipe.model, recipe.parallel
    if stored is None:
        expert_full = expert_bytes_per_rank(_whole(recipe), precision)
        bank_rank = bank_bytes_per_rank(recipe, precision)
        return (expert_bytes_per_rank(recipe, precision), expert_full, bank_rank,
                expert_full * m.num_experts * m.num_moe_layers, bank_rank * par.ranks)
    sizes_LE = stored.sizes_LE(recipe)
    owner_LE = contiguous_owner(m.num_moe_layers, m.num_experts, par.ep)
    bank_rank = max(int(sizes_LE[owner_LE == r].sum()) for r in range(par.ep))
    return None, None, bank_rank, stored.node_bank_bytes(recipe), int(sizes_LE.sum()) * par.tp


def _whole(recipe: Recipe) -> Recipe:
    """The recipe on one rank: every expert whole."""
    return dataclasses.replace(recipe, parallel=ParallelSpec(tp=1, ep=1))


def _stored_table(recipe: Recipe, stored: StoredExperts) -> dict[str, dict[str, int]]:
    per_rank, whole = precision_bytes(recipe), precision_bytes(_whole(recipe))
    return {p: {"expert_bytes": per_rank[p], "expert_bytes_full": whole[p],
                "experts": int((stored.precision_LE == p).sum())}
            for p in PRECISIONS if (stored.precision_LE == p).any()}


def a2a_ledger(recipe: Recipe, comm: CommModel, bank_bytes: int | None = None) -> A2ALedger:
    """All-to-All traffic and time per step for the recipe's EP group (see the module docstring);
    `bank_bytes`: a card's routed experts at their stored precisions (default: native)."""
    m, ep = recipe.model, recipe.parallel.ep
    _check_comm(comm, ep)
    message_bytes = comm.tokens_per_step * m.top_k * m.hidden_size * comm.act_bytes  # [B]
    remote = (ep - 1) / ep * comm.cross_ratio  # [1]
    a2a_bytes = 2 * message_bytes * remote  # [B], dispatch + combine
    ms_per_layer = a2a_bytes / (comm.link_gbps * BYTES_PER_GB) * MS_PER_S  # [B] / [B/s] -> [s] -> [ms]
    ag_rs_bytes = ag_rs_bytes_per_layer(comm.tokens_per_step, m.hidden_size, comm.act_bytes, ep)
    ms_per_step = ms_per_layer * m.num_moe_layers
    share = None
    if comm.step_ms is not None:
        share = ms_per_step / (comm.step_ms + ms_per_step) if comm.step_ms + ms_per_step > 0 else 0.0
    return A2ALedger(
        ep=ep,
        tp=recipe.parallel.tp,
        experts_per_card=m.num_experts // ep,
        expert_bytes_per_card=bank_bytes_per_rank(recipe) if bank_bytes is None else bank_bytes,
        tokens_per_step=comm.tokens_per_step,
        top_k=m.top_k,
        hidden_size=m.hidden_size,
        act_bytes=comm.act_bytes,
        message_bytes=message_bytes,
        remote_fraction=remote,
        cross_ratio=comm.cross_ratio,
        a2a_bytes_per_layer=a2a_bytes,
        link_gbps=comm.link_gbps,
        a2a_ms_per_layer=ms_per_layer,
        ag_rs_bytes_per_layer=ag_rs_bytes,
        ag_rs_ms_per_layer=ag_rs_bytes / (comm.link_gbps * BYTES_PER_GB) * MS_PER_S,
        num_moe_layers=m.num_moe_layers,
        a2a_ms_per_step=ms_per_step,
        step_ms=comm.step_ms,
        comm_share=share,
    )


def ag_rs_bytes_per_layer(tokens_per_step: float, hidden: int, act_bytes: int, ep: int) -> float:
    """Bytes leaving one card per MoE layer in the all-gather + reduce-scatter exchange (see the
    module docstring): its tokens to the ep - 1 other cards, and their partial outputs back."""
    return 2.0 * tokens_per_step * hidden * act_bytes * (ep - 1)  # [B]


def exchange_prediction(recipe: Recipe, mode: str, tokens_per_rank: float, hidden: int, act_bytes: int) -> dict:
    """What the ledger predicts for a run's exchange (`ep_exchange` mode): bytes leaving one rank
    and ms per MoE layer at the `hidden` size and `act_bytes` the run allocated, with its mean
    `tokens_per_rank` (the all-gather pads every rank to the largest shard, which a trace's
    uneven shards make larger)."""
    small = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, hidden_size=hidden))
    whole = max(1, round(tokens_per_rank))  # the ledger takes whole tokens
    ledger = a2a_ledger(small, CommModel(tokens_per_step=whole, act_bytes=act_bytes))
    scale = tokens_per_rank / whole
    if mode == "allgather":
        nbytes, ms, by = (ledger.ag_rs_bytes_per_layer, ledger.ag_rs_ms_per_layer,
                          "ledger: 2 x tokens x hidden x act_bytes x (ep - 1)")
    else:
        nbytes, ms, by = (ledger.a2a_bytes_per_layer, ledger.a2a_ms_per_layer,
                          "ledger: 2 x tokens x top_k x hidden x act_bytes x (ep - 1) / ep")
    return {"mode": mode, "predicted_bytes_per_layer": nbytes * scale, "predicted_by": by,
            "predicted_ms_per_layer": ms * scale, "predicted_at_gbps": ledger.link_gbps}


def _check_comm(comm: CommModel, ep: int) -> None:
    if comm.tokens_per_step < 1:
        raise UsageError(f"--tokens: must be >= 1, got {comm.tokens_per_step}")
    if not 1 <= comm.act_bytes <= 8:
        raise UsageError(f"--act-bytes: must be in [1, 8], got {comm.act_bytes}")
    if not (math.isfinite(comm.link_gbps) and comm.link_gbps > 0):
        raise UsageError(f"--link-gbps: must be a positive number (GB/s), got {comm.link_gbps}")
    if not (math.isfinite(comm.cross_ratio) and comm.cross_ratio >= 0):
        raise UsageError(f"--cross-ratio: must be >= 0, got {comm.cross_ratio}")
    if ep > 1 and (ep - 1) / ep * comm.cross_ratio > 1 + 1e-12:
        raise UsageError(
            f"--cross-ratio: {comm.cross_ratio} makes more than all assignments remote at "
            f"ep {ep}; the most is {ep / (ep - 1):.4g}"
        )
    if comm.step_ms is not None and not (math.isfinite(comm.step_ms) and comm.step_ms > 0):
        raise UsageError(f"--step-ms: must be a positive number of ms, got {comm.step_ms}")


def find_hot_experts(
    counts_LE: np.ndarray, layers: tuple[int, ...], factor: float = HOT_EXPERT_FACTOR
) -> tuple[HotExpert, ...]:
    """Experts whose count is above `factor` x the mean of their layer, by (layer, expert).

    counts_LE: [L, E] routed-assignment counts; layers: model layer index of each row.
    """
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    mean_L = counts_LE.mean(axis=1)
    out = []
    for row, layer in enumerate(layers):
        if mean_L[row] <= 0:
            continue
        for e in np.flatnonzero(counts_LE[row] > factor * mean_L[row]):
            c = float(counts_LE[row, e])
            out.append(HotExpert(int(layer), int(e), c, float(mean_L[row]), c / float(mean_L[row])))
    return tuple(out)


def build_ledger(
    recipe: Recipe,
    comm: CommModel,
    *,
    reserve_gib: float,
    hot_gib: float | None = None,
    hot_source: str = "auto",
    hist: Histogram | None = None,
    hist_path: str | os.PathLike | None = None,
    warn: Callable[[str], None] = lambda message: None,
    host: HostFit | None = None,
    precision: str = "native",
    stored: StoredExperts | None = None,
) -> Ledger:
    """Both ledgers and their flags, experts at their stored `precision`; a routing histogram
    (checked against the recipe, `warn` told each warning; `hist_path` names it) adds the
    hot-expert check."""
    mem = memory_ledger(recipe, reserve_gib, hot_gib, hot_source, precision, stored)
    a2a = a2a_ledger(recipe, comm, mem.bank_bytes_per_rank)
    flags: list[Flag] = []
    if mem.room_gib is not None and mem.room_gib <= 0:
        flags.append(
            Flag(
                "no_room",
                f"no GPU memory left for hot experts: {mem.room_gib:.2f} GiB after dense "
                f"weights, KV cache and reserve; add ranks or shrink the KV cache",
            )
        )
    if host is not None and not host.fits:  # host: hotset/host_memory.host_fit
        flags.append(Flag("host_mem", host.explain()))
    too_big = over_gpu(recipe, mem.hot_gib, reserve_gib) if mem.hot_source != "auto" else None
    if too_big:
        flags.append(Flag("over_gpu", too_big))
    if a2a.comm_share is not None and a2a.comm_share > COMM_SHARE_LIMIT:
        flags.append(
            Flag(
                "comm_share",
                f"All-to-All takes {100 * a2a.comm_share:.1f}% of the step "
                f"({a2a.a2a_ms_per_step:.3f} of {a2a.a2a_ms_per_step + a2a.step_ms:.3f} ms), "
                f"above {100 * COMM_SHARE_LIMIT:.0f}%",
            )
        )
    hot = None
    if hist is not None:
        for warning in check_hist_matches_recipe(hist, recipe, hist_path):
            warn(warning)
        hot = find_hot_experts(hist.counts_LE, hist.layers)
        for h in hot:
            flags.append(
                Flag(
                    "hot_expert",
                    f"layer {h.layer} expert {h.expert}: {h.count:g} assignments, "
                    f"{h.ratio:.2f}x the layer mean ({h.layer_mean:.4g})",
                )
            )
    return Ledger(recipe.name, recipe.model.name, mem, comm, a2a, hot, tuple(flags))
