"""Dispatch and combine (docs/runtime.md, "Expert parallelism"): each routed assignment goes to one
replica of its expert by the replica rule every prediction uses
(`hotsplit_cli.placement.dispatch.choose_replicas`), is computed there on the rank's hot slot or
cold bank, and its output comes back to the token's rank, summed in float32 as the reference does.
Two exchanges (`ep_exchange`) with the same rule, so loads, hit rates and swaps are the same in
both: `AllToAll` (uneven all_to_all_single: counts, then rows and expert ids) and `AllGather`
(vLLM's: routing and rows all-gathered, partial outputs reduce-scattered). Only single-tensor
collectives, posted in the same order on every rank: the list forms do not work on gloo.
Activation bytes leaving a rank are what the ledger's formulas predict; ids, weights and counts
are counted apart."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import ReplicaMap, choose_replicas

# torch 2.13 renamed the single-tensor collectives (the old names warn FutureWarning on every
# call); the same ops, gloo and NCCL both. Older torch has only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Sent:
    """One layer's dispatch on this rank (a2a), kept for its combine."""

    order_A: torch.Tensor  # int64 [A]: flattened (t * K + k) assignments in send order
    send_counts: list[int]  # [R] assignments sent to each rank
    recv_counts: list[int]  # [R] assignments received from each rank
    x_AH: torch.Tensor  # received rows
    experts_A: torch.Tensor  # int64: their logical experts


@dataclass
class Gathered:
    """One layer's dispatch on this rank (allgather), kept for its combine."""

    rows_A: torch.Tensor  # int64 [A]: row of each assignment's token in the gathered [R * T_max] tokens
    w_A: torch.Tensor  # float32 [A]: its routing weight
    x_AH: torch.Tensor  # the assignments' token rows
    experts_A: torch.Tensor  # int64: their logical experts


@dataclass
class ExchangeStats:
    """Totals since the run began (this rank)."""

    loads: list[list[int]] = field(default_factory=list)  # per step: assignments received per layer
    act_bytes: int = 0  # activation bytes leaving this rank, dispatch + combine
    meta_bytes: int = 0  # ids, weights and counts leaving this rank
    ms: float = 0.0  # wall time inside the collectives
    exchanges: int = 0  # (step, layer) exchanges


class _Exchange:
    """What both exchanges share: the replica map, this rank's place, the device `group` (gloo on a
    CPU, NCCL with a GPU per rank), the gloo `control` group for counts and routing, the timing."""

    def __init__(self, replicas: ReplicaMap, rank: int, world: int, group=None, control=None):
        self.replicas, self.rank, self.world = replicas, rank, world
        self.group, self.control = group, control
        self.stats = ExchangeStats()
        self._loads_L: list[int] = []  # this step's assignments received, per layer

    def set_replicas(self, replicas: ReplicaMap) -> None:
        """A new map, between two steps (every rank switches at the same step)."""
        self.replicas = replicas

    def begin_step(self, num_tokens: int) -> None:
        """Before a step's first layer (every rank)."""

    def end_step(self) -> None:
        self.stats.loads.append(self._loads_L)
        self._loads_L = []

    def _collective(self, fn, out: torch.Tensor, inp: torch.Tensor, *args, group) -> None:
        """`fn(out, inp, *args, group=group)`, timed; device tensors cross a gloo group through the
        host (ranks sharing a GPU)."""
        t0 = time.perf_counter()
        if out.is_cuda and dist.get_backend(group) == "gloo":
            host = torch.empty(out.shape, dtype=out.dtype)
            fn(host, inp.cpu(), *args, group=group)
            out.copy_(host)
        else:
            fn(out, inp, *args, group=group)
        self.stats.ms += (time.perf_counter() - t0) * 1e3


class AllToAll(_Exchange):
    """The uneven all_to_all_single exchange of one rank (the module docstring's a2a)."""

    def dispatch(self, li: int, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor) -> Sent:
        T, K = ids_TK.shape
        R, dev = self.world, x_TH.device
        ids = ids_TK.detach().cpu().numpy()
        slot_A = choose_replicas(ids, self.replicas, li, self.rank).reshape(-1)
        dest_A = np.where(slot_A >= 0, self.replicas.slot_rank(slot_A), R)  # padding sorts last, is not sent
        order = np.argsort(dest_A, kind="stable")
        order = order[dest_A[order] < R]
        send_counts = np.bincount(dest_A[order], minlength=R)[:R]
        counts_in = torch.from_numpy(send_counts.astype(np.int64))
        counts_out = torch.empty_like(counts_in)
        self._collective(dist.all_to_all_single, counts_out, counts_in, group=self.control)
        recv_counts, send = counts_out.tolist(), send_counts.tolist()
        order_A = torch.from_numpy(order).to(dev)
        x_send = x_TH[order_A // K].contiguous()
        e_send = ids_TK.reshape(-1).to(dev).long()[order_A].contiguous()
        x_recv = x_TH.new_empty((sum(recv_counts), x_TH.shape[1]))
        e_recv = torch.empty(sum(recv_counts), dtype=torch.int64, device=dev)
        self._collective(dist.all_to_all_single, x_recv, x_send, recv_counts, send, group=self.group)
        self._collective(dist.all_to_all_single, e_recv, e_send, recv_counts, send, group=self.group)
        row = x_TH.shape[1] * x_TH.element_size()
        remote_sent = sum(send) - send[self.rank]
        self.stats.act_bytes += remote_sent * row
        self.stats.meta_bytes += remote_sent * 8 + (R - 1) * 8
        self.stats.exchanges += 1
        self._loads_L.append(sum(recv_counts))
        return Sent(order_A, send, recv_counts, x_recv, e_recv)

    def combine(self, sent: Sent, y_AH: torch.Tensor, w_TK: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Outputs [T, H] of this rank's tokens: sum over k of w x output of its replica."""
        K = w_TK.shape[1]
        back = y_AH.new_empty((len(sent.order_A), y_AH.shape[1]))
        self._collective(dist.all_to_all_single, back, y_AH.contiguous(), sent.send_counts, sent.recv_counts,
                         group=self.group)
        returned = sum(sent.recv_counts) - sent.recv_counts[self.rank]  # outputs going back to other ranks
        self.stats.act_bytes += returned * y_AH.shape[1] * y_AH.element_size()
        w_A = w_TK.reshape(-1).float()[sent.order_A]
        out = torch.zeros(num_tokens, y_AH.shape[1], dtype=torch.float32, device=y_AH.device)
        out.index_add_(0, sent.order_A // K, back.float() * w_A[:, None])
        return out.to(y_AH.dtype)


class AllGather(_Exchange):
    """The all-gather + reduce-scatter exchange of one rank (the module docstring's allgather)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens_R: list[int] = []  # this step's token count of every rank

    def begin_step(self, num_tokens: int) -> None:
        mine = torch.tensor([num_tokens], dtype=torch.int64)
        every = torch.empty(self.world, dtype=torch.int64)
        self._collective(all_gather_single, every, mine, group=self.control)
        self.tokens_R = every.tolist()
        self.stats.meta_bytes += (self.world - 1) * 8

    def dispatch(self, li: int, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor) -> Gathered:
        T, K = ids_TK.shape
        H, R, dev = x_TH.shape[1], self.world, x_TH.device
        assert self.tokens_R[self.rank] == T, "begin_step was told another token count"
        Tm = max(self.tokens_R)
        # Ids and weights in one float32 tensor: ids are below 2^24, exact in float32.
        route = torch.full((Tm, 2 * K), -1.0, dtype=torch.float32)
        route[:T, :K] = ids_TK.detach().cpu().float()
        route[:T, K:] = w_TK.detach().cpu().float()
        routes = torch.empty(R * Tm, 2 * K, dtype=torch.float32)
        self._collective(all_gather_single, routes, route, group=self.control)
        x_pad = x_TH.new_zeros((Tm, H))
        x_pad[:T] = x_TH
        x_all = x_TH.new_empty((R * Tm, H))
        self._collective(all_gather_single, x_all, x_pad, group=self.group)
        routes_np = routes.view(R, Tm, 2 * K).numpy()
        rows, experts, weights = [], [], []
        for src in range(R):  # every source's assignments to my replicas, as that source routes them
            ids = routes_np[src, :self.tokens_R[src], :K].astype(np.int64)
            slot = choose_replicas(ids, self.replicas, li, src).reshape(-1)
            mine = np.flatnonzero((slot >= 0) & (self.replicas.slot_rank(slot) == self.rank))
            rows.append(src * Tm + mine // K)
            experts.append(ids.reshape(-1)[mine])
            weights.append(routes_np[src, :self.tokens_R[src], K:].reshape(-1)[mine])
        rows_A = torch.from_numpy(np.concatenate(rows)).to(dev)
        self.stats.act_bytes += (R - 1) * Tm * H * x_TH.element_size()
        self.stats.meta_bytes += (R - 1) * Tm * 2 * K * 4
        self.stats.exchanges += 1
        self._loads_L.append(len(rows_A))
        return Gathered(rows_A, torch.from_numpy(np.concatenate(weights).astype(np.float32)).to(dev),
                        x_all[rows_A], torch.from_numpy(np.concatenate(experts)).to(dev))

    def combine(self, sent: Gathered, y_AH: torch.Tensor, w_TK: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Outputs [T, H] of this rank's tokens: every rank's partial sums of w x output, reduce-scattered."""
        R, H, Tm = self.world, y_AH.shape[1], max(self.tokens_R)
        partial = torch.zeros(R * Tm, H, dtype=torch.float32, device=y_AH.device)
        partial.index_add_(0, sent.rows_A, y_AH.float() * sent.w_A[:, None])
        out = y_AH.new_empty((Tm, H))
        self._collective(reduce_scatter_single, out, partial.to(y_AH.dtype), group=self.group)
        self.stats.act_bytes += (R - 1) * Tm * H * y_AH.element_size()
        return out[:num_tokens]


EXCHANGES = {"a2a": AllToAll, "allgather": AllGather}  # the ep_exchange knob's values (validated by the knob)


class ExpertParallel:
    """A rank's built model (model.py `HotColdMoE`) with its routed experts reached through `exchange`:
    a layer around it, handing each step's routed computation to the model, which keeps its banks,
    swaps and counters, counting what this rank receives (`live_counts_LE`: since the last rebalance)."""

    def __init__(self, model, exchange: AllToAll | AllGather):
        self.model, self.exchange = model, exchange
        self.live_counts_LE = torch.zeros(model.counts_LE.shape, dtype=torch.int64)

    def __getattr__(self, name: str):  # the rest (banks, swaps, device, geometry) is the model's
        return getattr(self.__dict__["model"], name)

    @property
    def held_LE(self) -> np.ndarray:
        """bool [L, E]: the experts with a replica on this rank, by the map the exchange routes with."""
        return self.exchange.replicas.held_LE(self.exchange.rank)

    def read_counters(self, reset_window: bool = True) -> dict[str, np.ndarray]:
        """The model's counters, its counts only of the experts held here now, so that a dynamic
        swap never brings in an expert a rebalance took away."""
        out = self.model.read_counters(reset_window)
        out["counts_LE"][~self.held_LE] = 0.0
        return out

    def exchange_layer(self, li: int, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor,
                       counts_E: torch.Tensor, compute) -> torch.Tensor:
        """`compute(x_AH, ids_A1, w_A1)` computes the received assignments (K = 1, weight 1)."""
        sent = self.exchange.dispatch(li, x_TH, ids_TK, w_TK)
        e_A = sent.experts_A
        counts_E.scatter_add_(0, e_A, torch.ones_like(e_A))
        y_AH = compute(sent.x_AH, e_A[:, None], torch.ones(len(e_A), 1, dtype=torch.float32, device=x_TH.device))
        return self.exchange.combine(sent, y_AH, w_TK, x_TH.shape[0])

    def end_step(self, step_LE: torch.Tensor) -> None:
        self.live_counts_LE += step_LE
        self.exchange.end_step()

    def step(self, x_TH, ids_LTK=None, w_LTK=None):
        self.exchange.begin_step(x_TH.shape[0])
        h = self.model.step(x_TH, ids_LTK, w_LTK, routed=self._routed, held_LE=self.held_LE)
        self.end_step(self.model.step_counts_LE.cpu())
        return h

    def _routed(self, li: int, x_TH, ids_TK, w_TK, counts_E: torch.Tensor) -> torch.Tensor:
        m = self.model
        return self.exchange_layer(li, x_TH, ids_TK, w_TK, counts_E,
                                   lambda x, ids, w: m.compute(x, ids, w, m.banks[li], counts_E))
