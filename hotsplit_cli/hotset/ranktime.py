"""Predicted time of each expert-parallel rank per decode step, and a layout that balances it
(numpy only). One evaluation, shared by `plan --placement --platform` and `place --platform`.

Shape letters: L = MoE layers, E = logical experts, P = physical experts (slots), R = ranks.

Cost model (the plan's, per rank): a hot expert costs nothing per token (it lives in GPU memory);
a cold physical expert is read over PCIe when some token of the step routes to it. A logical
expert's assignments are split evenly over its replicas (the round-robin replica rule), so one
token reaches a given replica of e with chance pi_e / logcnt_e, and at batch B (tokens per step)
the replica is read with chance q = 1 - (1 - pi_e / logcnt_e)^B. A rank's cold time in a layer is
sum over its cold slots of q x expert bytes / read rate. Every layer ends in an all-to-all, so the
step waits, layer by layer, for the slowest rank: the step's time is the sum over layers of the
largest rank time (`step_ms`, "max-rank ms per step").

The time-balanced layout starts from the token-balanced one and swaps, within a layer, a physical
expert of the slowest rank with one of another rank (never two replicas of an expert on a rank),
re-planning every rank's hot set after each round; a round is kept only when the predicted
step time drops. See docs/placement.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.evaluate import physical_counts

TIME_ROUNDS = 48  # rounds of swaps: a bound on the work (each round re-plans every rank's hot set twice at most)
_REL_EPS = 1e-12


@dataclass(frozen=True)
class RankTimes:
    """Predicted cold reads of every rank and layer at one batch size."""

    batch: int  # tokens per step
    cold_ms_LR: np.ndarray  # float [L, R]: each rank's cold read time in each layer (ms)
    cold_experts_R: np.ndarray  # float [R]: expected distinct cold physical experts read per step

    @property
    def step_ms(self) -> float:
        """Sum over layers of the slowest rank's time: what the step waits for."""
        return float(self.cold_ms_LR.max(axis=1).sum())

    @property
    def rank_ms_R(self) -> np.ndarray:
        return self.cold_ms_LR.sum(axis=0)

    def to_doc(self) -> dict:
        return {"batch": self.batch, "step_ms": self.step_ms, "rank_ms": [float(x) for x in self.rank_ms_R],
                "rank_cold_experts": [float(x) for x in self.cold_experts_R]}


def physical_plan(counts_LE: np.ndarray, placement: Placement, expert_bytes, budget_bytes: int):
    """Each rank's hot set among the physical experts placed on it (planner.Plan over [R, L, P]).
    `expert_bytes`: one expert's stored bytes, or each logical expert's [L, E] (an auto plan's)."""
    values_LP, rank_LP = physical_counts(counts_LE, placement)
    return plan_hot_set(values_LP, slot_bytes(expert_bytes, placement), budget_bytes, rank_of_LE=rank_LP,
                        num_ranks=placement.num_ranks)


def slot_bytes(expert_bytes, placement: Placement):
    """The stored bytes of each physical expert: one figure for all, or [L, P] from each logical
    expert's [L, E] (a replica is stored as its expert is)."""
    if np.ndim(expert_bytes) == 0:
        return expert_bytes
    return np.take_along_axis(np.asarray(expert_bytes), placement.phy2log_LP, 1)


def slot_probs(pi_LE: np.ndarray, placement: Placement) -> np.ndarray:
    """float [L, P]: the chance one token reaches each physical expert (pi_e / replicas of e)."""
    phy = placement.phy2log_LP
    cnt = placement.logcnt_LE(pi_LE.shape[1])
    return np.take_along_axis(pi_LE, phy, 1) / np.take_along_axis(cnt, phy, 1)


def rank_times(pi_LE: np.ndarray, placement: Placement, hot_LP: np.ndarray, expert_bytes,
               read_gbps: float, batch: int) -> RankTimes:
    """The cost model of the module docstring. pi_LE: chance one token routes to each logical
    expert (planfile.routing_probs); hot_LP: bool [L, P], the physical experts held hot;
    `expert_bytes` as `physical_plan` takes it."""
    L, P = placement.phy2log_LP.shape
    q_LP = np.where(hot_LP, 0.0, 1.0 - (1.0 - slot_probs(pi_LE, placement)) ** batch)
    shape = (L, placement.num_ranks, placement.slots_per_rank)
    q_LRS = q_LP.reshape(shape)
    if np.ndim(expert_bytes) == 0:
        cold_ms_LR = q_LRS.sum(axis=2) * (expert_bytes / (read_gbps * 1e9) * 1e3)
    else:  # each slot read at its own stored bytes
        bytes_LRS = slot_bytes(expert_bytes, placement).reshape(shape)
        cold_ms_LR = (q_LRS * bytes_LRS).sum(axis=2) / (read_gbps * 1e9) * 1e3
    return RankTimes(batch, cold_ms_LR, q_LRS.sum(axis=(0, 2)))


def hot_slots(plan, placement: Placement) -> np.ndarray:
    """bool [L, P] from a physical plan's hot_RLE [R, L, P]: each slot is hot on its own rank."""
    return plan.hot_RLE[placement.rank_P, :, np.arange(placement.num_physical)].T


@dataclass(frozen=True)
class TimeModel:
    """What a layout's time is predicted from: fitted counts, the per-rank budget, the rate."""

    counts_LE: np.ndarray  # routed assignments the hot sets are planned on
    pi_LE: np.ndarray  # chance one token routes to each expert (of the traffic being timed)
    expert_bytes: int | np.ndarray  # one expert's stored bytes, or each logical expert's [L, E]
    budget_bytes: int
    read_gbps: float
    batch: int

    def times(self, placement: Placement, pi_LE: np.ndarray | None = None) -> RankTimes:
        """Hot sets planned on `counts_LE`, cold reads timed on `pi_LE` (default: the fitted)."""
        return self.timed(placement, pi_LE)[0]

    def timed(self, placement: Placement, pi_LE: np.ndarray | None = None) -> tuple[RankTimes, np.ndarray]:
        """`times` and the hot slots (bool [L, P]) they were predicted with."""
        hot = hot_slots(physical_plan(self.counts_LE, placement, self.expert_bytes, self.budget_bytes), placement)
        pi = self.pi_LE if pi_LE is None else pi_LE
        return rank_times(pi, placement, hot, self.expert_bytes, self.read_gbps, self.batch), hot


def balance_time(model: TimeModel, start: Placement, rounds: int = TIME_ROUNDS) -> Placement:
    """A layout whose predicted step time is never above `start`'s (module docstring)."""
    phy = start.phy2log_LP.copy()
    L, P = phy.shape
    R, S = start.num_ranks, start.slots_per_rank
    best, hot = model.timed(start)
    stuck = np.zeros(L, dtype=bool)
    for _ in range(rounds):
        layout = Placement(start.layers, R, phy)
        q_LP = 1.0 - (1.0 - slot_probs(model.pi_LE, layout)) ** model.batch
        if np.ndim(model.expert_bytes):  # experts of different sizes: weigh each read by its bytes
            q_LP = q_LP * slot_bytes(model.expert_bytes, layout)
        swaps = _best_swaps(phy.reshape(L, R, S), q_LP.reshape(L, R, S), hot.reshape(L, R, S), stuck,
                            R // start.num_nodes)
        if not swaps:
            break
        improved = False
        for trial in (swaps, swaps[:1]):  # every layer's best swap at once, else the most promising alone
            cand = phy.copy()
            for layer, i, j in trial:
                cand[layer, i], cand[layer, j] = cand[layer, j], cand[layer, i]
            got, got_hot = model.timed(Placement(start.layers, R, cand, "hotsplit-time", start.num_nodes))
            if got.step_ms < best.step_ms * (1 - 1e-9):
                phy, best, hot, improved = cand, got, got_hot, True
                break
        if not improved:
            stuck[swaps[0][0]] = True
    # Each rank's experts ascending, as place writes them (the sets, hence the times, are unchanged).
    return Placement(start.layers, R, np.sort(phy.reshape(L, R, S), axis=2).reshape(L, P), "hotsplit-time",
                     start.num_nodes)


def _best_swaps(phy_LRS: np.ndarray, q_LRS: np.ndarray, hot_LRS: np.ndarray, stuck_L: np.ndarray,
                ranks_per_node: int) -> list[tuple[int, int, int]]:
    """Per layer not `stuck`, the swap (layer, slot, slot) of a slot of the slowest rank with a slot
    of another rank of its node (hierarchical layouts keep their expert groups on nodes) that most
    lowers the layer's slowest time, hot sets held fixed (an estimate: the caller re-plans the hot
    sets and keeps only swaps that lower the exact time); most promising layer first."""
    L, R, S = phy_LRS.shape
    cold_LRS = np.where(hot_LRS, 0.0, q_LRS)
    load_LR = cold_LRS.sum(axis=2)
    out = []
    for layer in np.flatnonzero(~stuck_L):
        a = int(np.argmax(load_LR[layer]))
        # What a slot of a costs on another rank (cold there unless hot here), and vice versa.
        xa = q_LRS[layer, a]  # [S]
        node = a // ranks_per_node
        others = [b for b in range(node * ranks_per_node, (node + 1) * ranks_per_node) if b != a]
        base = load_LR[layer, a]
        best = None
        for b in others:
            new_a = base - cold_LRS[layer, a][:, None] + q_LRS[layer, b][None, :]  # [S(a), S(b)]
            new_b = load_LR[layer, b] - cold_LRS[layer, b][None, :] + xa[:, None]
            third = np.delete(load_LR[layer], [a, b]).max() if R > 2 else 0.0
            peak = np.maximum(np.maximum(new_a, new_b), third)
            ea, eb = phy_LRS[layer, a], phy_LRS[layer, b]
            dup = np.isin(ea, eb)[:, None] | np.isin(eb, ea)[None, :]
            peak = np.where(dup, np.inf, peak)
            k = int(np.argmin(peak))
            if best is None or peak.flat[k] < best[0] - _REL_EPS * abs(best[0]):
                best = (float(peak.flat[k]), b, *divmod(k, S))
        if best is not None and best[0] < base * (1 - 1e-9):
            gain, b, i, j = base - best[0], best[1], best[2], best[3]
            out.append((gain, int(layer), a * S + i, b * S + j))
    out.sort(key=lambda s: (-s[0], s[1]))
    return [(layer, i, j) for _, layer, i, j in out]
