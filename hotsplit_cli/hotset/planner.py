"""The hot-set planner (numpy only; never imports torch).

Shape letters: L = MoE layers, E = routed experts, N = candidate items (flattened (l, e)),
R = ranks. Values are routed-assignment counts; sizes are bytes one rank holds of one expert.

Objective: choose hot (layer, expert) pairs maximising routed assignments served from GPU
memory, subject to hot bytes <= budget per rank. This is a 0/1 knapsack; with equal sizes the
top experts by count are optimal, otherwise greedy by share per byte is near-optimal and an
exact solver (brute force / dynamic programming over size classes) confirms or improves it.
The fractional (LP) relaxation gives an upper bound on the hit rate of any plan.
See docs/planner.md for a worked example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.checks import check_finite_nonneg, index_str
from hotsplit_cli.core.errors import BudgetOverflowError, HistogramError, PlanError

BRUTE_FORCE_MAX_ITEMS = 18
DP_MAX_CELLS = 50_000_000


@dataclass(frozen=True)
class Selection:
    """The answer to one knapsack: which items, how good, and how far from the LP bound."""

    chosen_N: np.ndarray  # bool [N]
    value: float  # sum of chosen values
    used_bytes: int
    greedy_value: float
    bound_value: float  # fractional (LP) optimum: no plan can serve more
    method: str  # "greedy" | "top-n" | "brute-force" | "dp"
    certified: bool  # True when `value` is proven optimal


@dataclass(frozen=True)
class Plan:
    """Per-rank hot sets and what they are expected to serve."""

    hot_RLE: np.ndarray  # bool [R, L, E]
    hot_bytes_R: np.ndarray  # int64 [R]
    budget_bytes: int  # per rank
    hit_rate: float  # share of all routed assignments served hot
    layer_hit_rate_L: np.ndarray  # float64 [L]
    greedy_hit_rate: float
    bound_hit_rate: float  # LP upper bound on any plan's hit rate under this budget
    methods: tuple[str, ...]  # per rank
    certified: bool  # every rank's selection proven optimal

    @property
    def gap(self) -> float:
        return max(0.0, self.bound_hit_rate - self.hit_rate)


def check_counts(counts_LE: np.ndarray, where: str = "counts") -> np.ndarray:
    """Typed errors for the planner's input (the file reader gives friendlier ones first)."""
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    if counts_LE.ndim != 2 or 0 in counts_LE.shape:
        raise HistogramError(f"{where}: expected a non-empty [layers, experts] array, got shape {counts_LE.shape}")
    check_finite_nonneg(counts_LE, HistogramError, lambda idx, problem: f"{where}{index_str(idx)} is {problem}")
    if not counts_LE.any():
        raise HistogramError(f"{where} is all zero")
    return counts_LE


def _broadcast_sizes(expert_bytes, shape: tuple[int, int]) -> np.ndarray:
    sizes = np.asarray(expert_bytes)
    if not np.issubdtype(sizes.dtype, np.integer):
        if not np.all(np.isfinite(sizes)) or np.any(sizes != np.round(sizes)):
            raise PlanError(f"expert bytes must be whole numbers, got {expert_bytes!r}")
        sizes = sizes.astype(np.int64)
    if sizes.ndim == 1:
        sizes = sizes[:, None]
    try:
        sizes = np.broadcast_to(sizes.astype(np.int64), shape)
    except ValueError:
        raise PlanError(f"expert bytes of shape {np.shape(expert_bytes)} do not match counts {shape}") from None
    if np.any(sizes <= 0):
        raise PlanError("expert bytes must be > 0")
    return sizes


def lp_bound(values_N: np.ndarray, sizes_N: np.ndarray, budget: int) -> float:
    """Fractional knapsack optimum: take items by value per byte, the last one in part."""
    order = _ratio_order(values_N, sizes_N)
    v, s = values_N[order], sizes_N[order].astype(np.float64)
    cum = np.cumsum(s)
    full = int(np.searchsorted(cum, budget, side="right"))
    total = float(v[:full].sum())
    if full < len(v):
        room = budget - (cum[full - 1] if full else 0.0)
        total += float(v[full]) * room / s[full]
    return total


def _ratio_order(values_N: np.ndarray, sizes_N: np.ndarray) -> np.ndarray:
    """Indices by value per byte, descending; ties by index ascending (stable)."""
    return np.lexsort((np.arange(len(values_N)), -(values_N / sizes_N)))


def greedy_select(values_N: np.ndarray, sizes_N: np.ndarray, budget: int) -> np.ndarray:
    """Greedy by value per byte: take each item that still fits (skip, don't stop, on a misfit).

    Items with zero value are never chosen: an expert that saw no traffic earns nothing hot.
    """
    chosen = np.zeros(len(values_N), dtype=bool)
    order = _ratio_order(values_N, sizes_N)
    order = order[values_N[order] > 0]
    sizes = sizes_N[order]
    cum = np.cumsum(sizes)
    prefix = int(np.searchsorted(cum, budget, side="right"))
    chosen[order[:prefix]] = True
    room = budget - (int(cum[prefix - 1]) if prefix else 0)
    if prefix < len(order) and room >= sizes[prefix:].min():
        for i in order[prefix:]:
            if sizes_N[i] <= room:
                chosen[i] = True
                room -= int(sizes_N[i])
    return chosen


def brute_force_select(values_N: np.ndarray, sizes_N: np.ndarray, budget: int) -> np.ndarray:
    """Exhaustive search over every subset (N <= BRUTE_FORCE_MAX_ITEMS). Ties: the first subset
    in lexicographic order of the greedy-ranked items, for determinism."""
    n = len(values_N)
    if n > BRUTE_FORCE_MAX_ITEMS:
        raise PlanError(f"brute force is limited to {BRUTE_FORCE_MAX_ITEMS} items, got {n}")
    masks = ((np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)
    vals = masks @ values_N
    used = masks @ sizes_N.astype(np.int64)
    vals = np.where(used <= budget, vals, -1.0)
    best = vals.max()
    # Among optimal subsets prefer the fewest bytes, then the smallest bitmask (deterministic).
    cand = np.flatnonzero(vals >= best - 1e-9 * max(1.0, abs(best)))
    pick = cand[np.argmin(used[cand])]  # argmin returns the first minimum
    return masks[pick]


def dp_select(values_N: np.ndarray, sizes_N: np.ndarray, budget: int) -> np.ndarray | None:
    """Exact 0/1 knapsack by dynamic programming over size classes.

    Within one size class the best k items are the k with the largest values, so the problem
    reduces to choosing a count per class: DP over classes on a grid of gcd(sizes) bytes.
    Returns None when the grid would be too large to solve exactly.
    """
    sizes_u, inverse = np.unique(sizes_N, return_inverse=True)
    unit = math.gcd(*[int(s) for s in sizes_u])
    cap = budget // unit
    n_items = len(values_N)
    if (cap + 1) * (n_items + len(sizes_u)) > DP_MAX_CELLS:
        return None
    neg = -np.inf
    best = np.full(cap + 1, neg)
    best[0] = 0.0
    choice = []  # per class: [cap+1] count taken at each capacity
    class_orders = []
    for c, size in enumerate(sizes_u):
        members = np.flatnonzero(inverse == c)
        order = members[_ratio_order(values_N[members], sizes_N[members])]
        order = order[values_N[order] > 0]
        class_orders.append(order)
        w = int(size) // unit
        prefix = np.concatenate([[0.0], np.cumsum(values_N[order])])
        new = best.copy()
        take = np.zeros(cap + 1, dtype=np.int64)
        for k in range(1, len(order) + 1):
            shift = k * w
            if shift > cap:
                break
            cand = np.full(cap + 1, neg)
            cand[shift:] = best[: cap + 1 - shift] + prefix[k]
            better = cand > new + 1e-12
            new = np.where(better, cand, new)
            take = np.where(better, k, take)
        best = new
        choice.append(take)
    # Walk back from the best final capacity (smallest capacity among ties: fewest bytes).
    at = int(np.flatnonzero(best >= best.max() - 1e-9 * max(1.0, best.max()))[0])
    chosen = np.zeros(n_items, dtype=bool)
    for c in range(len(sizes_u) - 1, -1, -1):
        k = int(choice[c][at])
        chosen[class_orders[c][:k]] = True
        at -= k * (int(sizes_u[c]) // unit)
    return chosen


def select(values_N: np.ndarray, sizes_N: np.ndarray, budget: int) -> Selection:
    """Solve one rank's knapsack: greedy, then confirm or improve it exactly where feasible."""
    values_N = np.asarray(values_N, dtype=np.float64)
    sizes_N = np.asarray(sizes_N, dtype=np.int64)
    if budget < 0:
        raise PlanError(f"budget must be >= 0 bytes, got {budget}")
    greedy = greedy_select(values_N, sizes_N, budget)
    greedy_value = float(values_N[greedy].sum())
    bound = lp_bound(values_N, sizes_N, budget) if len(values_N) else 0.0
    chosen, method, certified = greedy, "greedy", False
    positive = values_N > 0
    if len(np.unique(sizes_N[positive])) <= 1:
        method, certified = "top-n", True  # equal sizes: the largest counts are optimal
    elif positive.sum() <= BRUTE_FORCE_MAX_ITEMS:
        idx = np.flatnonzero(positive)
        sub = brute_force_select(values_N[idx], sizes_N[idx], budget)
        exact = np.zeros_like(greedy)
        exact[idx[sub]] = True
        chosen, method, certified = _better(values_N, greedy, exact, "brute-force")
    else:
        exact = dp_select(values_N, sizes_N, budget)
        if exact is not None:
            chosen, method, certified = _better(values_N, greedy, exact, "dp")
    used = int(sizes_N[chosen].sum())
    if used > budget:
        raise BudgetOverflowError(f"internal: plan uses {used} bytes, budget is {budget}")
    return Selection(chosen, float(values_N[chosen].sum()), used, greedy_value, bound, method, certified)


def _better(values_N, greedy, exact, name):
    g, x = values_N[greedy].sum(), values_N[exact].sum()
    if x > g * (1 + 1e-12) + 1e-12:
        return exact, name, True
    return greedy, f"greedy ({name}-certified)", True


def plan_hot_set(counts_LE, expert_bytes, budget_bytes: int, rank_of_LE: np.ndarray | None = None,
                 num_ranks: int = 1) -> Plan:
    """Plan the hot experts of every rank under a per-rank byte budget.

    counts_LE: routed-assignment counts [L, E]. expert_bytes: bytes per rank of one expert
    (scalar, [L] or [L, E]). TP (`rank_of_LE` None): every rank holds the same hot set chosen
    over all experts. EP: `rank_of_LE` [L, E] gives the rank that owns each expert, and each
    rank ranks only its own experts.
    """
    counts_LE = check_counts(counts_LE)
    if not isinstance(budget_bytes, int | np.integer) or budget_bytes < 0:
        raise PlanError(f"budget must be a whole number of bytes >= 0, got {budget_bytes!r}")
    if num_ranks < 1:
        raise PlanError(f"num_ranks must be >= 1, got {num_ranks}")
    L, E = counts_LE.shape
    sizes_LE = _broadcast_sizes(expert_bytes, (L, E))
    values = counts_LE.ravel()
    sizes = sizes_LE.ravel()
    total = values.sum()
    hot_RLE = np.zeros((num_ranks, L, E), dtype=bool)
    hot_bytes = np.zeros(num_ranks, dtype=np.int64)
    served = greedy_served = bound = 0.0
    methods, certified = [], True
    if rank_of_LE is None:
        sel = select(values, sizes, int(budget_bytes))
        hot_RLE[:] = sel.chosen_N.reshape(L, E)
        hot_bytes[:] = sel.used_bytes
        served, greedy_served, bound = sel.value, sel.greedy_value, sel.bound_value
        methods, certified = [sel.method] * num_ranks, sel.certified
    else:
        rank_of = np.asarray(rank_of_LE).ravel()
        if rank_of.shape != values.shape:
            raise PlanError(f"rank_of_LE has shape {np.shape(rank_of_LE)}, expected {(L, E)}")
        for r in range(num_ranks):
            idx = np.flatnonzero(rank_of == r)
            sel = select(values[idx], sizes[idx], int(budget_bytes))
            flat = np.zeros(L * E, dtype=bool)
            flat[idx[sel.chosen_N]] = True
            hot_RLE[r] = flat.reshape(L, E)
            hot_bytes[r] = sel.used_bytes
            served += sel.value
            greedy_served += sel.greedy_value
            bound += sel.bound_value
            methods.append(sel.method)
            certified &= sel.certified
    served_mask = hot_RLE.any(axis=0)
    row = counts_LE.sum(axis=1)
    layer_hit = np.divide((counts_LE * served_mask).sum(axis=1), row, out=np.zeros(L), where=row > 0)
    return Plan(
        hot_RLE=hot_RLE,
        hot_bytes_R=hot_bytes,
        budget_bytes=int(budget_bytes),
        hit_rate=float(served / total),
        layer_hit_rate_L=layer_hit,
        greedy_hit_rate=float(greedy_served / total),
        bound_hit_rate=float(min(1.0, bound / total)),
        methods=tuple(methods),
        certified=bool(certified),
    )


def contiguous_owner(num_layers: int, num_experts: int, ep: int) -> np.ndarray:
    """Default EP layout: expert e of every layer lives on rank e // (E / ep)."""
    if num_experts % ep:
        raise PlanError(f"ep={ep} does not divide {num_experts} experts")
    return np.broadcast_to(np.arange(num_experts) // (num_experts // ep), (num_layers, num_experts)).copy()


@dataclass(frozen=True)
class Swap:
    layer: int  # row index into the bank (not the model layer id)
    out_expert: int  # leaves its hot slot
    in_expert: int  # takes that slot
    in_count: float
    out_count: float


def propose_swaps(counts_LE: np.ndarray, hot_LE: np.ndarray, max_swaps: int, margin: float) -> list[Swap]:
    """Dynamic-mode rule, shared by the runtime and the simulator (through `SwapRule`).

    Per layer, the swaps that gain the most: the set of at most `max_swaps` (out, in) pairs, each
    expert in at most one pair and each pair with in_count > margin * out_count, that maximises
    the sum of in_count - out_count. That set is always the k strongest cold experts and the k
    weakest hot ones (ties by expert id) for the largest k whose k-th pair still gains and whose
    experts can be paired within the margin: strongest incoming with the strongest outgoing of
    the k, and so on (if those pairs fail, so does every other pairing). Swaps keep each layer's
    number of hot slots, so the budget is never exceeded.
    """
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    hot_LE = np.asarray(hot_LE, dtype=bool)
    if counts_LE.shape != hot_LE.shape or counts_LE.ndim != 2:
        raise PlanError(f"live counts {counts_LE.shape} and hot mask {hot_LE.shape} must match [L, E]")
    check_finite_nonneg(counts_LE, PlanError, lambda *_: "live counts must be finite and >= 0")
    if max_swaps < 0 or margin < 1.0:
        raise PlanError(f"bad swap knobs: max_swaps={max_swaps}, margin={margin}")
    swaps: list[Swap] = []
    if max_swaps == 0:
        return swaps
    E = counts_LE.shape[1]
    ids = np.arange(E)
    for layer in range(counts_LE.shape[0]):
        hot = hot_LE[layer]
        if hot.all() or not hot.any():
            continue
        c = counts_LE[layer]
        cold_ids, hot_ids = ids[~hot], ids[hot]
        ins = cold_ids[np.lexsort((cold_ids, -c[cold_ids]))][:max_swaps]  # strongest cold first
        outs = hot_ids[np.lexsort((hot_ids, c[hot_ids]))][:max_swaps]  # weakest hot first
        k = 0
        for j in range(min(len(ins), len(outs))):
            # The (j+1)-th pair must gain, and the j+1 incoming must pair within the margin with
            # the j+1 outgoing, strongest with strongest. Both only get harder as j grows.
            if c[ins[j]] <= c[outs[j]] or not (c[ins[:j + 1]] > margin * c[outs[j::-1]]).all():
                break
            k = j + 1
        for i in range(k):
            e_in, e_out = int(ins[i]), int(outs[k - 1 - i])
            swaps.append(Swap(layer, e_out, e_in, float(c[e_in]), float(c[e_out])))
    return swaps


class SwapRule:
    """The dynamic-mode rule with memory, one instance per run (runtime and simulator alike).

    Two scores per (layer, expert): the last window's counts, and a decayed score
    `decayed = decay * decayed + counts` (an exponential moving average up to a constant factor;
    with decay 0.8 a window's counts keep weight 0.8^k after k more windows, a memory of about
    1 / (1 - decay) = 5 windows). Neither is right for all traffic: the decayed score ignores one
    window's noise on stationary traffic, the last window follows a hotspot that moves every few
    windows. So each layer keeps, per score, the credit it has earned: the assignments of every
    new window that its top-k experts (k = the layer's hot slots, as scored before the window)
    would have served. A layer's swaps come from `propose_swaps` on the score with more credit
    (ties: the last window). decay 0 makes the two scores one: the last window alone.
    docs/simulate.md has the measurements. Called like `propose_swaps`.
    """

    def __init__(self, decay: float):
        if not 0.0 <= decay <= 1.0:
            raise PlanError(f"swap decay must be in [0, 1], got {decay}")
        self.decay = float(decay)
        self.last_LE: np.ndarray | None = None  # the last window's counts
        self.decayed_LE: np.ndarray | None = None
        self.credit_2L: np.ndarray | None = None  # [last window, decayed] x layers

    @property
    def score_LE(self) -> np.ndarray | None:
        """The score each layer swaps on now (None before the first window)."""
        if self.last_LE is None:
            return None
        use_decayed = self.credit_2L[1] > self.credit_2L[0]
        return np.where(use_decayed[:, None], self.decayed_LE, self.last_LE)

    def __call__(self, counts_LE: np.ndarray, hot_LE: np.ndarray, max_swaps: int, margin: float) -> list[Swap]:
        counts_LE, hot_LE = check_window(counts_LE, hot_LE, self.last_LE)
        if self.last_LE is None:
            self.last_LE, self.decayed_LE = counts_LE, counts_LE
            self.credit_2L = np.zeros((2, counts_LE.shape[0]))
        else:
            slots_L = hot_LE.sum(axis=1)
            for j, score in enumerate((self.last_LE, self.decayed_LE)):
                self.credit_2L[j] += (counts_LE * _top_k_mask(score, slots_L)).sum(axis=1)
            self.last_LE, self.decayed_LE = counts_LE, self.decay * self.decayed_LE + counts_LE
        return propose_swaps(self.score_LE, hot_LE, max_swaps, margin)


def check_window(counts_LE, hot_LE, earlier_LE: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A window rule's input as arrays: counts [L, E] finite and >= 0, the hot mask of the same
    shape, and the shape of the earlier windows (`earlier_LE`, None at the first)."""
    counts_LE = np.asarray(counts_LE, dtype=np.float64)
    hot_LE = np.asarray(hot_LE, dtype=bool)
    if counts_LE.shape != hot_LE.shape or counts_LE.ndim != 2:
        raise PlanError(f"live counts {counts_LE.shape} and hot mask {hot_LE.shape} must match [L, E]")
    if earlier_LE is not None and earlier_LE.shape != counts_LE.shape:
        raise PlanError(f"live counts {counts_LE.shape} do not match the earlier windows' {earlier_LE.shape}")
    check_finite_nonneg(counts_LE, PlanError, lambda *_: "live counts must be finite and >= 0")
    return counts_LE, hot_LE


def _top_k_mask(score_LE: np.ndarray, k_L: np.ndarray) -> np.ndarray:
    """bool [L, E]: the k_L[l] highest-scored experts of each layer (ties by expert id)."""
    L, E = score_LE.shape
    order = np.lexsort((np.broadcast_to(np.arange(E), (L, E)), -score_LE), axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(E), (L, E)), axis=1)
    return rank < k_L[:, None]
