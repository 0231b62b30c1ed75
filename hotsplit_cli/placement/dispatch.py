"""Expert-parallel dispatch, the library side (numpy only): which rank holds each token, which
replica serves each routed assignment, and how evenly that spreads a step's load. The runtime
(runtime/distributed/dispatch.py) calls these very functions on every layer of every step, and
every prediction (`plan --placement --trace`, the EP run's predicted balancedness) evaluates
traffic through them, so a prediction and a run apply one rule.

Shape letters: S = steps, L = MoE layers, T = tokens of a step (all ranks), K = top_k,
E = logical experts, P = physical experts (slots), R = ranks, X = replicas of one expert.

Tokens are data-parallel: rank r steps tokens `token_shard(T, R, r)` of each step (contiguous,
the first T mod R ranks one more).

Replica rule (round-robin by occurrence, deterministic and balanced): on source rank s, take the
step's assignments of one layer in (token, k) order; the i-th assignment to logical expert e
(counting from 0, among s's assignments to e) goes to replica (i + s) mod logcnt[e] of e, where
the replicas of e are its physical slots in ascending order (`log2phy`). One source's traffic to
an expert is split over its replicas with counts differing by at most one, and sources start at
different replicas, so the remainders do not all land on replica 0. It needs no communication:
each rank decides from its own tokens. A token-index hash (vLLM) balances only on average; a
replica on the token's own rank (SGLang's static table) saves exchange bytes but concentrates
load where the tokens are. Without a placement the layout is contiguous: expert e on rank
e // (E / R), one replica each, so the rule is moot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.placement.algorithm import Geometry, Placement
from hotsplit_cli.placement.evaluate import physical_counts, trivial_layout


def contiguous_placement(layers, num_experts: int, num_ranks: int) -> Placement:
    """The layout without a placement file: slot p holds expert p, rank r holds experts
    [r E / R, (r + 1) E / R) (the planner's `contiguous_owner`)."""
    if num_experts % num_ranks:
        raise PlanError(f"ep={num_ranks} does not divide {num_experts} experts")
    return dataclasses.replace(trivial_layout(num_experts, layers, Geometry(num_ranks)), method="contiguous")


def token_shard(num_tokens: int, num_ranks: int, rank: int) -> slice:
    """The tokens of a step that `rank` steps: contiguous, the first T mod R ranks one more."""
    base, extra = divmod(num_tokens, num_ranks)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


@dataclass(frozen=True)
class ReplicaMap:
    """A placement as the dispatcher reads it: per layer the replicas of each expert (log2phy,
    ascending, -1 padded), their count, and the rank of each slot."""

    log2phy_LEX: np.ndarray  # int64 [L, E, X]
    logcnt_LE: np.ndarray  # int64 [L, E]
    slots_per_rank: int
    num_ranks: int

    @classmethod
    def of(cls, placement: Placement, num_experts: int) -> ReplicaMap:
        return cls(placement.log2phy_LEX(num_experts), placement.logcnt_LE(num_experts), placement.slots_per_rank,
                   placement.num_ranks)

    def slot_rank(self, slot: np.ndarray) -> np.ndarray:
        return slot // self.slots_per_rank

    def held_LE(self, rank: int) -> np.ndarray:
        """bool [L, E]: the logical experts with a replica on `rank`."""
        return ((self.log2phy_LEX >= 0) & (self.slot_rank(self.log2phy_LEX) == rank)).any(axis=-1)


def choose_replicas(ids_TK: np.ndarray, replicas: ReplicaMap, layer: int, src_rank: int) -> np.ndarray:
    """Physical slot (int64 [T, K]) serving each assignment of `src_rank`'s tokens in one layer,
    by the round-robin rule of the module docstring. Ids < 0 (padding) get slot -1."""
    ids = np.asarray(ids_TK, dtype=np.int64)
    flat = ids.reshape(-1)
    valid = flat >= 0
    e = np.where(valid, flat, 0)
    # Occurrence index of each assignment among the earlier ones to the same expert; padding is
    # keyed apart (-1), so it takes no expert's turn.
    key = np.where(valid, flat, -1)
    order = np.argsort(key, kind="stable")
    sorted_e = key[order]
    first = np.searchsorted(sorted_e, sorted_e, side="left")
    occ = np.empty_like(flat)
    occ[order] = np.arange(len(flat)) - first
    cnt = replicas.logcnt_LE[layer, e]
    replica = (occ + src_rank) % cnt
    slot = replicas.log2phy_LEX[layer, e, replica]
    return np.where(valid, slot, -1).reshape(ids.shape)


def balancedness(loads_XR: np.ndarray) -> float:
    """Sum over exchanges of the mean rank load / sum of the max rank load (1.0 when nothing
    moved). Each row is one exchange: one (step, layer)."""
    loads = np.asarray(loads_XR, dtype=np.float64).reshape(-1, np.shape(loads_XR)[-1])
    peak = float(loads.max(axis=1).sum())
    return float(loads.mean(axis=1).sum()) / peak if peak > 0 else 1.0


def window_balancedness(loads_SLR: np.ndarray, steps_per_window: int) -> float:
    """`balancedness` of the loads summed over windows of `steps_per_window` steps (the last one
    may be shorter): the granularity `place` evaluates a histogram's windows at, so a run can be
    judged against a placement's prediction."""
    loads = np.asarray(loads_SLR, dtype=np.float64)
    S, L, R = loads.shape
    W = -(-S // steps_per_window)
    padded = np.zeros((W * steps_per_window, L, R))
    padded[:S] = loads
    return balancedness(padded.reshape(W, steps_per_window, L, R).sum(axis=1).reshape(-1, R))


@dataclass(frozen=True)
class TracePrediction:
    """What an EP run of a trace will measure, through the replica rule."""

    loads_SLR: np.ndarray  # int64 [S, L, R] assignments each rank receives
    hits_R: np.ndarray  # int64 [R] of them served hot (static hot sets)
    balancedness: float

    @property
    def hit_rate_R(self) -> np.ndarray:
        received = self.loads_SLR.sum(axis=(0, 1))
        return np.divide(self.hits_R, received, out=np.zeros(len(received)), where=received > 0)


def predict_trace(ids_SLTK: np.ndarray, placement: Placement, num_experts: int,
                  hot_RLE: np.ndarray | None = None) -> TracePrediction:
    """Per-step rank loads, balancedness and (with static hot sets `hot_RLE`, bool [R, L, E])
    each rank's hit counts of a trace replayed on `placement` by the replica rule."""
    ids_SLTK = np.asarray(ids_SLTK)
    S, L, T, _ = ids_SLTK.shape
    replicas = ReplicaMap.of(placement, num_experts)
    R = replicas.num_ranks
    loads = np.zeros((S, L, R), dtype=np.int64)
    hits = np.zeros(R, dtype=np.int64)
    rank_P = placement.rank_P
    for s in range(S):
        for src in range(R):
            shard = ids_SLTK[s, :, token_shard(T, R, src)]
            for li in range(L):
                slot = choose_replicas(shard[li], replicas, li, src)
                ok = slot >= 0
                dest = rank_P[slot[ok]]
                loads[s, li] += np.bincount(dest, minlength=R)
                if hot_RLE is not None:
                    hot = hot_RLE[dest, li, shard[li][ok]]
                    hits += np.bincount(dest[hot], minlength=R)
    return TracePrediction(loads, hits, balancedness(loads.reshape(S * L, R)))


def stack_rank_traces(ranks_SLTK: list[list[np.ndarray]]) -> np.ndarray:
    """The routing each rank sent (per rank, per step int32 [L, T, K]) as one trace int32
    [S, L, R x T_max, K]: step s holds the ranks' batches in rank order, padded with -1 to the
    step's largest, so `predict_trace` shards it back (padding takes no turn of the replica rule)."""
    S, R = len(ranks_SLTK[0]), len(ranks_SLTK)
    L, K = ranks_SLTK[0][0].shape[0], ranks_SLTK[0][0].shape[2]
    T = max((r[s].shape[1] for r in ranks_SLTK for s in range(S)), default=0)
    out = np.full((S, L, R * T, K), -1, dtype=np.int32)
    for r, steps in enumerate(ranks_SLTK):
        for s, ids_LTK in enumerate(steps):
            out[s, :, r * T:r * T + ids_LTK.shape[1]] = ids_LTK
    return out


def placed_hit_rates(counts_LE: np.ndarray, placement: Placement, hot_RLE: np.ndarray) -> np.ndarray:
    """Each rank's expected hit rate (float [R]) when traffic `counts_LE` is split evenly over
    the replicas (a histogram's view: no token order) and rank r serves its replicas of the
    experts hot in `hot_RLE[r]` (bool [R, L, E]) from its hot slots."""
    values_LP, rank_LP = physical_counts(counts_LE, placement)
    L = values_LP.shape[0]
    hot_LP = np.asarray(hot_RLE)[rank_LP, np.arange(L)[:, None], placement.phy2log_LP]
    R = placement.num_ranks
    served = np.bincount(rank_LP[hot_LP], weights=values_LP[hot_LP], minlength=R)
    total = np.bincount(rank_LP.ravel(), weights=values_LP.ravel(), minlength=R)
    return np.divide(served, total, out=np.zeros(R), where=total > 0)
