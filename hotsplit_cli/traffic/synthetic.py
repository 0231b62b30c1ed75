"""Synthetic routing traffic (numpy): expert popularity with skew, sampled so that the routed
shares reproduce a histogram, with an optional drifting hotspot.

Shape letters: L = MoE layers, E = experts, T = tokens per step, K = top_k, S = steps.

A token picks K distinct experts. Drawing them one by one without replacement flattens the
shares; instead each token uses systematic probability-proportional-to-size sampling, whose
inclusion probability of expert e is exactly K * share[e] (shares above 1/K are capped, since
no expert can serve more than every token). So the expected counts equal the histogram's.
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.core.errors import InputFileError, PlanError
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.trace import Trace


def zipf_shares(num_layers: int, num_experts: int, skew: float, seed: int = 0) -> np.ndarray:
    """Per layer, Zipf(skew) popularity over a random permutation of experts; rows sum to 1."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, num_experts + 1) ** skew
    p = np.stack([base[rng.permutation(num_experts)] for _ in range(num_layers)])
    return p / p.sum(axis=1, keepdims=True)


def recipe_shares(recipe) -> tuple[np.ndarray, str]:
    """(expert shares [L, E], their name) of a recipe's `traffic.kind` synthetic (Zipf of its skew)
    or histogram (its counts, refused when they are not the recipe's [layers, experts])."""
    m, t = recipe.model, recipe.traffic
    if t.kind == "synthetic":
        return zipf_shares(m.num_moe_layers, m.num_experts, t.skew, t.seed), f"synthetic skew {t.skew:g}"
    hist = load_hist(t.path)
    if hist.counts_LE.shape != (m.num_moe_layers, m.num_experts):
        raise InputFileError(f"{t.path}: histogram is {list(hist.counts_LE.shape)} (layers x experts), "
                             f"{recipe.name} has [{m.num_moe_layers}, {m.num_experts}]")
    return hist.counts_LE, f"histogram {t.path}"


def inclusion_probs(shares_LE: np.ndarray, top_k: int) -> np.ndarray:
    """Per-token inclusion probabilities K * share, capped at 1 with the excess redistributed."""
    s = np.asarray(shares_LE, dtype=np.float64)
    row = s.sum(axis=1, keepdims=True)
    if np.any(row <= 0):
        raise PlanError("every layer needs some traffic to sample from")
    pi = top_k * s / row
    E = s.shape[1]
    if top_k > E:
        raise PlanError(f"top_k {top_k} exceeds {E} experts")
    for _ in range(E):
        over = pi > 1.0 + 1e-12
        if not over.any():
            break
        pi = np.minimum(pi, 1.0)
        fixed = pi >= 1.0 - 1e-12
        free_mass = top_k - fixed.sum(axis=1, keepdims=True)
        rest = np.where(fixed, 0.0, pi)
        rest_sum = rest.sum(axis=1, keepdims=True)
        pi = np.where(fixed, 1.0, rest * np.divide(free_mass, rest_sum, out=np.zeros_like(rest_sum),
                                                    where=rest_sum > 0))
    return pi


def sample_topk(pi_LE: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw `tokens` tokens per layer, each with K distinct experts (int32 [L, T, K])."""
    L, E = pi_LE.shape
    order = np.argsort(rng.random((L, tokens, E)), axis=2)  # random unit order per token
    cum = np.cumsum(np.take_along_axis(np.broadcast_to(pi_LE[:, None, :], (L, tokens, E)), order, 2), axis=2)
    u = rng.random((L, tokens, 1))
    hits = np.floor(cum - u + 1e-12)
    # floor(0 - u) = -1: the points u, u+1, ... are counted from the start of the line.
    prev = np.concatenate([np.full((L, tokens, 1), -1.0), hits[:, :, :-1]], axis=2)
    picked = hits > prev
    # Systematic sampling picks exactly K units when sum(pi) == K; guard float edge cases.
    n = picked.sum(axis=2)
    if np.any(n != top_k):
        bad = n != top_k
        ranks = np.argsort(-(pi_LE[:, None, :].repeat(tokens, 1) + rng.random((L, tokens, E)) * 1e-9), axis=2)
        fix = np.zeros_like(picked)
        np.put_along_axis(fix, ranks[:, :, :top_k], True, axis=2)
        order_fix = np.argsort(order, axis=2)
        picked[bad] = np.take_along_axis(fix, order_fix, 2)[bad]
    ids = np.nonzero(picked)[2].reshape(L, tokens, top_k)
    return np.take_along_axis(order, ids, axis=2).astype(np.int32)


class SyntheticTraffic:
    """A stream of routing steps following `shares_LE`; every `drift_every` steps the hotspot
    moves (each layer's popularity is rolled by a fixed offset over the experts)."""

    def __init__(self, shares_LE: np.ndarray, top_k: int, batch: int, drift_every: int = 0,
                 seed: int = 0, drift_shift: int | None = None):
        self.shares_LE = np.asarray(shares_LE, dtype=np.float64)
        self.top_k = top_k
        self.batch = batch
        self.drift_every = drift_every
        E = self.shares_LE.shape[1]
        self.drift_shift = drift_shift if drift_shift is not None else max(1, E // 3)
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self._epoch = -1
        self._pi = None

    def shares_at(self, step: int) -> np.ndarray:
        epoch = step // self.drift_every if self.drift_every else 0
        return np.roll(self.shares_LE, epoch * self.drift_shift, axis=1)

    def next_step(self) -> np.ndarray:
        """int32 [L, T, K] expert ids for the next engine step."""
        epoch = self.step // self.drift_every if self.drift_every else 0
        if epoch != self._epoch:
            self._epoch = epoch
            self._pi = inclusion_probs(self.shares_at(self.step), self.top_k)
        self.step += 1
        return sample_topk(self._pi, self.batch, self.top_k, self.rng)


def synthetic_trace(shares_LE: np.ndarray, layers, steps: int, batch: int, top_k: int,
                    drift_every: int = 0, seed: int = 0) -> Trace:
    """A whole trace [S, L, T, K] from `SyntheticTraffic`."""
    src = SyntheticTraffic(shares_LE, top_k, batch, drift_every, seed)
    ids = np.stack([src.next_step() for _ in range(steps)])
    return Trace(ids, tuple(int(x) for x in layers))
