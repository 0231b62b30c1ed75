"""Staging slots replayed on a routing trace: the exact counters a runtime with prefetch must
reproduce (numpy only; never imports torch). docs/prefetch.md defines every step.

Shape letters: S = steps, T = tokens per step, N = S x T tokens, L = MoE layers, E = experts.

While MoE layer l - 1 computes, a predictor (traffic/predict.py) guesses layer l's experts for
each token of the step; the union of the tokens' first `guesses` cold guesses are the
candidates. A candidate b is staged when the step's chance of reading it, p(b) = 1 - prod over
the step's tokens of (1 - q_t(b)), pays for its copy by the one admission rule of swaps
(`admission.copy_pays`, with the copy priced at `copy_price` cold reads); the strongest first
(ties by expert id) while a staging slot is free. Layer l then reads a staged expert from GPU
memory. A staged expert is never hot, and slots hold a step's experts for that step only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.config.knobs import PREFETCH_POOLS as STAGING_POOLS
from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.admission import copy_pays
from hotsplit_cli.traffic.predict import NextLayerPredictor


@dataclass(frozen=True)
class StagingConfig:
    slots: int  # staging slots per predicted layer ("layer") or for all layers together ("shared")
    pool: str
    guesses: int  # guesses per token (past top_k widens)
    copy_price: float = 0.0  # a staged copy's cost in cold reads: the share compute does not hide

    def __post_init__(self) -> None:
        if self.slots < 0 or self.guesses < 1 or self.pool not in STAGING_POOLS or not 0.0 <= self.copy_price <= 1.0:
            raise PlanError(f"bad staging: slots={self.slots}, pool={self.pool!r}, guesses={self.guesses}, "
                            f"copy_price={self.copy_price}", f"pool is one of {', '.join(STAGING_POOLS)}")

    def carved_slots(self, num_layers: int) -> int:
        """Expert slots the pool takes from the hot budget (layer index 0 is never staged)."""
        return self.slots * (num_layers - 1) if self.pool == "layer" else self.slots


@dataclass
class StagingRun:
    """Per-step counters (each [S]); `hits` and `staged_hits` count routed assignments, the rest experts."""

    prefetched_S: np.ndarray
    useful_S: np.ndarray
    staged_hits_S: np.ndarray
    hits_S: np.ndarray  # assignments served from GPU memory: hot or staged
    cold_S: np.ndarray  # distinct experts still read cold
    copied_S: np.ndarray  # dynamic swaps' copies

    @classmethod
    def empty(cls, steps: int) -> StagingRun:
        return cls(*(np.zeros(steps, dtype=np.float64 if f in ("staged_hits_S", "hits_S") else np.int64)
                     for f in cls.__dataclass_fields__))

    def to_doc(self, expert_bytes: int, assignments: float) -> dict:
        """Totals and per-step rates; bytes are expert bytes moved over PCIe."""
        S = len(self.cold_S)
        prefetched, useful = int(self.prefetched_S.sum()), int(self.useful_S.sum())
        moved = int(self.cold_S.sum()) + prefetched + int(self.copied_S.sum())
        return {"prefetched": prefetched, "useful": useful, "wasted": prefetched - useful,
                "staged_hits": float(self.staged_hits_S.sum()), "copies": int(self.copied_S.sum()),
                "hit_rate": float(self.hits_S.sum()) / assignments if assignments else 0.0,
                "cold_reads": int(self.cold_S.sum()),
                "useful_bytes_per_step": useful * expert_bytes / S,
                "wasted_bytes_per_step": (prefetched - useful) * expert_bytes / S,
                "pcie_bytes_per_step": moved * expert_bytes / S}


def replay_staging(counts_SLE: np.ndarray, member_NLE: np.ndarray, windows, predictor: NextLayerPredictor,
                   cfg: StagingConfig) -> StagingRun:
    """Replay the trace's steps (counts float [S, L, E], the tokens' memberships bool [N, L, E],
    N = S x T in step order) with staging. `windows` yields (start, end, hot [L, E], swaps after)
    as `simulate.dynamic_windows` does; one window of every step is a static hot set."""
    S, L, E = counts_SLE.shape
    T = member_NLE.shape[0] // S
    if member_NLE.shape != (S * T, L, E):
        raise PlanError(f"token memberships {member_NLE.shape} do not match counts {counts_SLE.shape}")
    hot_SLE = np.zeros((S, L, E), dtype=bool)
    run = StagingRun.empty(S)
    for start, end, hot, swapped in windows:
        hot_SLE[start:end] = hot
        if end < S:
            run.copied_S[end] = swapped
    staged_SE = np.zeros((S, E), dtype=bool)  # the previous layer's staged experts (shared pool)
    for layer in range(L):
        if layer == 0 or cfg.slots == 0:
            staged_SE = np.zeros((S, E), dtype=bool)
        else:
            staged_SE = _stage_layer(member_NLE, hot_SLE[:, layer], staged_SE, layer, predictor, cfg)
        _count_layer(run, counts_SLE[:, layer], hot_SLE[:, layer], staged_SE)
    return run


def _stage_layer(member_NLE: np.ndarray, hot_SE: np.ndarray, before_SE: np.ndarray, layer: int,
                 predictor: NextLayerPredictor, cfg: StagingConfig) -> np.ndarray:
    """bool [S, E]: what each step stages for `layer` while the layer before it computes."""
    S, E = hot_SE.shape
    T = member_NLE.shape[0] // S
    q_NE = predictor.probs_NE(member_NLE, layer)
    rank_NE = predictor.rank_NE(member_NLE, layer)
    live_N = member_NLE[:, layer].any(axis=1)
    staged = np.zeros((S, E), dtype=bool)
    for s in range(S):
        rows = slice(s * T, (s + 1) * T)
        live = live_N[rows]
        rank, q = rank_NE[rows][live], q_NE[rows][live]
        keep = ~hot_SE[s][rank]  # the same experts drop from every row
        candidates = np.unique(rank[keep].reshape(len(rank), -1)[:, :cfg.guesses])
        p = 1.0 - np.prod(1.0 - q[:, candidates], axis=0)
        free = cfg.slots - int(before_SE[s].sum()) if cfg.pool == "shared" else cfg.slots
        order = np.lexsort((candidates, -p))
        chosen = [int(candidates[i]) for i in order if copy_pays(float(p[i]), cfg.copy_price)][:max(free, 0)]
        staged[s, chosen] = True
    return staged


def _count_layer(run: StagingRun, counts_SE: np.ndarray, hot_SE: np.ndarray, staged_SE: np.ndarray) -> None:
    active = counts_SE > 0
    run.prefetched_S += staged_SE.sum(axis=1)
    run.useful_S += (staged_SE & active).sum(axis=1)
    run.staged_hits_S += (counts_SE * staged_SE).sum(axis=1)
    run.hits_S += (counts_SE * (hot_SE | staged_SE)).sum(axis=1)
    run.cold_S += (active & ~hot_SE & ~staged_SE).sum(axis=1)
