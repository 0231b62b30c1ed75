"""A Hugging Face checkpoint expert-parallel: attention, dense layers and the KV cache replicated
per rank (each rank generates its share of the prompts, DP attention), routed experts
partitioned by the placement and reached through the synthetic runs' exchange
(runtime/distributed/dispatch.py `AllToAll` / `AllGather`).

- The node's cold bank is filled from the checkpoint once (`load_shared`): the node's local
  rank 0 loads every tensor, the other ranks map its files and read only the dense tensors.
- Each MoE layer's experts module computes through `EPExperts.forward` (the adapter's seam,
  `state.bank.forward(experts, x, ids, w)`): this rank's real tokens (padding and finished
  sequences are masked, as they are not counted) go to the ranks holding a replica of their
  experts, each rank computes what it received with its own `HFExpertBank` (hot slot or cold
  bank, as one rank does: K = 1, weight 1) and the outputs come back and are summed per token.
- Lockstep: every rank takes part in every exchange of every step. A step begins with an
  all_reduce of "still generating" (in the first MoE layer of a rank's forward, or before the
  `empty_forward` of a rank whose prompts are done); a done rank sends empty batches through
  every MoE layer in layer order until no rank generates (`lockstep`). Collectives are bounded by the
  group's timeout (launch.COLLECTIVE_TIMEOUT_S), so no rank waits forever on a dead peer.
- Counters count what this rank receives, against the map each step read, so its hit rate,
  dynamic swaps and live rebalancing are this rank's, as in a synthetic EP run (`EPMoE`).

Shape letters: T = tokens of a forward, K = top_k, H = hidden, A = assignments received,
L = MoE layers, E = experts, S = steps, R = ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import token_shard

from ..distributed.summary import gather_to_rank0
from .loader import HFModel, load_model


def prompt_share(prompts: list, world: int, rank: int) -> list:
    """This rank's prompts: a contiguous share, the first len mod R ranks one more (a rank
    may have none); the job's texts are the ranks' texts in rank order."""
    return prompts[token_shard(len(prompts), world, rank)]


def load_shared(path, info, group, allocator, dtype: torch.dtype | None = None, keep_trace: bool = False) -> HFModel:
    """Load the checkpoint over the node's shared cold bank (`allocator`: a SharedAllocator):
    its creator (local rank 0) loads and fills the bank, then the node's other ranks map it and
    load the rest; once every rank has mapped it, its files are unlinked."""
    if allocator.creator:
        hm = load_model(path, info, dtype, keep_trace, allocator)
        group.barrier()
    else:
        group.barrier()
        hm = load_model(path, info, dtype, keep_trace, allocator)
    group.barrier()
    allocator.unlink()
    return hm


class EPExperts:
    """One MoE layer's experts on an expert-parallel rank: the seam's `forward`."""

    def __init__(self, row: int, ep: EPCheckpoint):
        self.row, self.ep = row, ep

    def forward(self, experts: torch.nn.Module, x_TH: torch.Tensor, ids_TK: torch.Tensor,
                w_TK: torch.Tensor) -> torch.Tensor:
        return self.ep.layer(self.row, experts, x_TH, ids_TK, w_TK)


class EPCheckpoint:
    """A loaded checkpoint (HFModel) as one rank of an expert-parallel job: the layers' exchange,
    the lockstep of steps, and the counters of what this rank receives (the model interface the
    window bookkeeping and live rebalancing read: `read_counters`, `hot_LE`, `begin_swaps`,
    `publish_ready`, `exchange`, `held_LE`, `live_counts_LE`)."""

    def __init__(self, hm: HFModel, exchange, control=None):
        self.hm, self.exchange, self.control = hm, exchange, control
        self.banks, self.info = hm.banks, hm.banks[0].info
        L, E = len(hm.banks), hm.num_experts
        self.held_LE: np.ndarray | None = None  # bool [L, E]: experts with a replica here (set by the rank)
        self.local = False  # every expert computed here from the node's cold bank (calibration)
        self.step_LE = torch.zeros(L, E, dtype=torch.int64, device=self.info.device)  # received this step
        self.live_counts_LE = torch.zeros(L, E, dtype=torch.int64)  # since the last rebalance (rebalance.py)
        self.trace_steps: list[np.ndarray] = []  # per step: the routing this rank sent, int32 [L, T, K]
        self._sent: list[np.ndarray | None] = [None] * L
        self._loads: list[int] = []
        self._reset_window()
        for info in hm.layers:
            info.experts._hotsplit.bank = EPExperts(info.row, self)

    @property
    def num_layers(self) -> int:
        return len(self.banks)

    def _reset_window(self) -> None:
        L, E = self.step_LE.shape
        self.counts_LE, self.cold_reads_L = np.zeros((L, E)), np.zeros(L, dtype=np.int64)
        self.hits_L, self.assigned_L = np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64)

    @contextlib.contextmanager
    def computed_here(self):
        """Forwards without the exchange: every expert from this node's cold bank (it holds all
        of them), e.g. to count the routing of a calibration prefill without the other ranks."""
        self.local = True
        try:
            yield
        finally:
            self.local = False

    # ---- the exchange ----

    def layer(self, row: int, experts, x_TH, ids_TK, w_TK) -> torch.Tensor:
        if self.local:
            return self.banks[row].forward(experts, x_TH, ids_TK, w_TK)
        if row == 0:
            self.begin_step(True, x_TH.shape[0])
        mask_T = self.hm.counter.token_mask_T  # padding and finished sequences are not sent
        if mask_T is not None:
            ids_TK = torch.where(mask_T.to(ids_TK.device)[:, None], ids_TK, -1)
        return self._exchange(row, experts, x_TH, ids_TK, w_TK)

    def begin_step(self, generating: bool, num_tokens: int) -> bool:
        """Collective, before a step's first exchange: whether any rank still generates (then
        the exchange's own step start, on every rank)."""
        flag = torch.tensor([int(generating)], dtype=torch.int64)
        dist.all_reduce(flag, group=self.control)
        if not int(flag):
            return False
        self.exchange.begin_step(num_tokens)
        return True

    def _exchange(self, row: int, experts, x_TH, ids_TK, w_TK) -> torch.Tensor:
        sent = self.exchange.dispatch(row, x_TH, ids_TK, w_TK)
        e_A = sent.experts_A
        self.step_LE[row].scatter_add_(0, e_A, torch.ones_like(e_A))
        ones_A1 = torch.ones(len(e_A), 1, dtype=torch.float32, device=x_TH.device)
        y_AH = self.banks[row].forward(experts, sent.x_AH, e_A[:, None], ones_A1)
        self._loads.append(len(e_A))
        self._sent[row] = ids_TK.detach().to("cpu", torch.int32).numpy()
        return self.exchange.combine(sent, y_AH, w_TK, x_TH.shape[0])

    def empty_forward(self) -> None:
        """The forward of a rank whose prompts are done (after `begin_step(False, 0)` said another
        rank generates): an empty batch through every MoE layer in layer order, computing what
        the others send here."""
        H, K = self.banks[0].hidden, self.hm.top_k
        dev, dtype = self.info.device, self.banks[0].compute_dtype
        for info in self.hm.layers:
            self._exchange(info.row, info.experts, torch.empty(0, H, dtype=dtype, device=dev),
                           torch.empty(0, K, dtype=torch.int64, device=dev),
                           torch.empty(0, K, dtype=torch.float32, device=dev))

    def lockstep(self, forwards: Iterator) -> Iterator:
        """The job's steps on this rank, the same number on every rank: its own forwards (each
        starts with the agreement in its first MoE layer), then `empty_forward` while another
        rank generates. Call each, then `end_step`."""
        yield from forwards
        while self.begin_step(False, 0):
            yield self.empty_forward

    # ---- counters ----

    def served_hot_LE(self) -> np.ndarray:
        """What the last step read: the map only changes between steps."""
        return np.stack([b.served_hot_E for b in self.banks])

    def end_step(self) -> np.ndarray:
        """After each step on every rank: its received counts [L, E], counted against the map it read."""
        step = self.step_LE.cpu().numpy().copy()
        self.step_LE.zero_()
        hot = self.served_hot_LE()
        self.counts_LE += step
        self.assigned_L += step.sum(axis=1)
        self.hits_L += (step * hot).sum(axis=1)
        self.cold_reads_L += ((step > 0) & ~hot).sum(axis=1)
        self.live_counts_LE += torch.from_numpy(step)
        self.exchange.stats.loads.append(self._loads)
        self._loads = []
        self.trace_steps.append(np.stack(self._sent))  # every layer exchanged this step
        self._sent = [None] * self.num_layers
        return step

    def read_counters(self, reset_window: bool = True) -> dict[str, np.ndarray]:
        """The window's counters (HotColdMoE's); counts only of the experts this rank holds now
        (`held_LE`), so a dynamic swap never brings in an expert a rebalance took away."""
        out = {"counts_LE": self.counts_LE.copy(), "hits_L": self.hits_L.copy(),
               "assigned_L": self.assigned_L.copy(), "cold_reads_L": self.cold_reads_L.copy()}
        if self.held_LE is not None:
            out["counts_LE"][~self.held_LE] = 0.0
        if reset_window:
            self._reset_window()
        return out

    # ---- the hot sets ----

    def set_hot(self, hot_LE: np.ndarray) -> None:
        for bank, hot_E in zip(self.banks, hot_LE, strict=True):
            bank.set_hot(hot_E)

    def hot_LE(self) -> np.ndarray:
        """The hot sets once the swaps in flight land."""
        return np.stack([b.hot_E for b in self.banks])

    def begin_swaps(self, moves_by_layer: dict[int, list[tuple[int, int]]]) -> float:
        return sum(self.banks[li].begin_swaps(moves) for li, moves in moves_by_layer.items())

    def publish_ready(self, wait: bool = False) -> tuple[int, float]:
        n, ms = 0, 0.0
        for b in self.banks:
            dn, dms = b.publish_ready(wait)
            n, ms = n + dn, ms + dms
        return n, ms


def job_trace(trace_steps: list[np.ndarray], control=None) -> np.ndarray | None:
    """Collective: the job's routing as a trace on rank 0 (None elsewhere), int32 [S, L, R x T_max, K]:
    step s holds each rank's sent routing in rank order, padded with -1 to the step's largest
    batch, so `predict_trace` shards it back into the ranks' batches (padding takes no turn of
    the replica rule)."""
    ranks = gather_to_rank0(trace_steps, control)
    if ranks is None:
        return None
    S, R = len(ranks[0]), len(ranks)
    L, K = ranks[0][0].shape[0], ranks[0][0].shape[2]
    T = max((r[s].shape[1] for r in ranks for s in range(S)), default=0)
    out = np.full((S, L, R * T, K), -1, dtype=np.int32)
    for r, steps in enumerate(ranks):
        for s, ids_LTK in enumerate(steps):
            out[s, :, r * T:r * T + ids_LTK.shape[1]] = ids_LTK
    return out
