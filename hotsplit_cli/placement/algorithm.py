"""Expert-parallel replicas and placement (numpy only; never imports torch).

Shape letters: W = windows, L = MoE layers, E = logical experts, P = physical experts (slots),
R = ranks, X = independent rows (layers, or (layer, node) pairs in hierarchical mode),
N = items to pack, S = slots per rank (P / R).

A layout is three maps, named as in DeepSeek's EPLB: `phy2log` [L, P] (the logical expert in each
physical slot; slot p lives on rank p // S), `log2phy` [L, E, max replicas] (-1 padded) and
`logcnt` [L, E] (replicas per logical expert). A logical expert's traffic is split evenly across
its replicas, so a rank's load in a window is the sum of count / logcnt of the slots it holds.

The policy is composed of two primitives, both vectorised across rows:
- `replicate_experts`: give each expert one slot, then each redundant slot to the expert with the
  largest load per replica (never more replicas than ranks, so none needs to share a rank);
- `pack_items`: place items on packs with an exact quota per pack. Greedy in order of decreasing
  load, each item goes to the pack that least raises the objective sum over windows of the busiest
  pack's load (ties: the lighter pack, then the lower index); never two replicas of one expert in a
  pack; then pairwise swaps out of the pack that costs most, while the objective drops.
With windows, experts that peak together are split and experts that alternate may share a rank.
With one window (totals) the same objective is the busiest pack, and a faster form is used: the
items go in rounds of one per pack (round k: the k-th `num_packs` heaviest items, heaviest to the
lightest pack, a replica whose pack already holds its expert to the lightest free pack that does
not), then rounds of swaps between packs paired by load (the i-th busiest with the i-th
lightest). Both are vectorised across rows.
Hierarchical mode first packs expert groups on nodes (equal groups per node) with the same
primitive, then replicates and packs within each node. See docs/placement.md.

How evenly a layout spreads traffic, the choice of what to fit on, and the baselines are in
evaluate.py; the files (`hotsplit.placement/1`, SGLang's map) in file.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.checks import check_finite_nonneg
from hotsplit_cli.core.errors import PlanError, UsageError

REFINE_MAX_ROUNDS = 16  # later rounds gain < 0.5% balancedness on fitted data, none on later windows
REFINE_PAIRS = 4  # one window: the 4 busiest packs each swap with one of the 4 lightest, per round
_REL_EPS = 1e-12


@dataclass(frozen=True)
class Placement:
    """Replicas and placement of physical experts on EP ranks."""

    layers: tuple[int, ...]  # model layer id of each row
    num_ranks: int
    phy2log_LP: np.ndarray  # int64 [L, P]; slot p is on rank p // (P / num_ranks)
    method: str = "hotsplit"
    num_nodes: int = 1

    @property
    def num_physical(self) -> int:
        return int(self.phy2log_LP.shape[1])

    @property
    def slots_per_rank(self) -> int:
        return self.num_physical // self.num_ranks

    @property
    def rank_P(self) -> np.ndarray:
        """Rank of each physical slot (int64 [P])."""
        return np.arange(self.num_physical) // self.slots_per_rank

    def logcnt_LE(self, num_experts: int) -> np.ndarray:
        L = self.phy2log_LP.shape[0]
        flat = (np.arange(L)[:, None] * num_experts + self.phy2log_LP).ravel()
        return np.bincount(flat, minlength=L * num_experts).reshape(L, num_experts)

    def log2phy_LEX(self, num_experts: int) -> np.ndarray:
        """Physical slots of each logical expert, ascending, -1 padded (int64 [L, E, max replicas])."""
        return invert_phy2log(self.phy2log_LP, num_experts)

    def held_LE(self, rank: int, num_experts: int) -> np.ndarray:
        """bool [L, E]: the logical experts with a replica on `rank`."""
        S = self.slots_per_rank
        mine_LS = self.phy2log_LP[:, rank * S:(rank + 1) * S]
        held = np.zeros((mine_LS.shape[0], num_experts), dtype=bool)
        np.put_along_axis(held, mine_LS, True, axis=1)
        return held


def invert_phy2log(phy2log_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """log2phy [L, E, X] from phy2log [L, P]: slots of each expert ascending, -1 padded."""
    L, P = phy2log_LP.shape
    cnt = np.zeros((L, num_experts), dtype=np.int64)
    np.add.at(cnt, (np.repeat(np.arange(L), P), phy2log_LP.ravel()), 1)
    width = max(1, int(cnt.max()))
    order = np.lexsort((np.broadcast_to(np.arange(P), (L, P)), phy2log_LP), axis=1)  # by expert, then slot
    sorted_e = np.take_along_axis(phy2log_LP, order, 1)
    start = np.cumsum(cnt, axis=1) - cnt  # first sorted position of each expert
    k = np.arange(P)[None, :] - np.take_along_axis(start, sorted_e, 1)  # replica index
    out = np.full((L, num_experts, width), -1, dtype=np.int64)
    out[np.repeat(np.arange(L), P), sorted_e.ravel(), k.ravel()] = order.ravel()
    return out


# ---- primitives ------------------------------------------------------------------------------


def replicate_experts(weight_XE: np.ndarray, num_physical: int, max_replicas: int | None = None) -> np.ndarray:
    """Replicas per expert (int64 [X, E]) summing to `num_physical` in every row.

    Each expert gets one; each redundant slot goes to the expert with the largest weight per
    replica (ties: lowest id), never above `max_replicas`.
    """
    weight_XE = np.asarray(weight_XE, dtype=np.float64)
    X, E = weight_XE.shape
    if num_physical < E:
        raise PlanError(f"{num_physical} physical slots cannot hold {E} logical experts")
    if max_replicas is not None and num_physical > E * max_replicas:
        raise PlanError(f"{num_physical} slots exceed {E} experts x {max_replicas} replicas")
    cnt = np.ones((X, E), dtype=np.int64)
    extra = num_physical - E
    cap = extra if max_replicas is None else min(extra, max_replicas - 1)
    if extra == 0 or cap < 1:
        return cnt
    # The greedy (each slot to the largest weight / replicas, ties: lowest id) in closed form:
    # an expert's k-th extra replica scores w / k, decreasing in k, so the greedy takes exactly
    # the `extra` largest scores w_e / k (k <= cap), ties in the order (id, k). Only the `extra`
    # first experts in (weight desc, id) order can own one of them, and when there are `extra` of
    # them, their first scores alone reach the extra-th weight w_K: a k-th replica needs w_e / k >= w_K.
    top = np.argsort(-weight_XE, axis=1, kind="stable")[:, :extra]
    top.sort(axis=1)  # ids ascending: the flat scores below run in (id, k) order
    w_XK = np.take_along_axis(weight_XE, top, 1)
    K = top.shape[1]
    w_min = w_XK.min(axis=1)
    if K == extra and (w_min > 0).all():
        cap = int(min(cap, np.floor((w_XK.max(axis=1) / w_min).max()) + 1))  # + 1: rounding
    score = (w_XK[:, :, None] / np.arange(1, cap + 1)).reshape(X, K * cap)
    kth = np.partition(score, K * cap - extra, axis=1)[:, K * cap - extra, None]  # the extra-th largest
    above, at = score > kth, score == kth
    take = above | at
    ties = np.flatnonzero(take.sum(axis=1) > extra)  # more scores equal the threshold than fit
    if len(ties):
        room = extra - above[ties].sum(axis=1, keepdims=True)
        take[ties] = above[ties] | (at[ties] & (np.cumsum(at[ties], axis=1) <= room))
    cnt[np.arange(X)[:, None], top] += take.reshape(X, K, cap).sum(axis=2)
    return cnt


def expand_replicas(logcnt_XE: np.ndarray) -> np.ndarray:
    """Logical expert of each physical item, grouped by expert (int64 [X, P])."""
    X, E = logcnt_XE.shape
    P = int(logcnt_XE[0].sum())
    return np.stack([np.repeat(np.arange(E), logcnt_XE[x]) for x in range(X)]).reshape(X, P)


def pack_items(load_WXN: np.ndarray, num_packs: int, owner_XN: np.ndarray | None = None,
               refine: bool = True) -> np.ndarray:
    """Pack index of each item (int64 [X, N]); every pack gets exactly N / num_packs items.

    Minimises, per row, sum over windows of the busiest pack's load. `owner_XN` (expert id of
    each item) forbids two items of one owner in a pack; None allows it (EPLB's behaviour).
    """
    load_WXN = np.asarray(load_WXN, dtype=np.float64)
    W, X, N = load_WXN.shape
    if N % num_packs:
        raise PlanError(f"{N} items do not split evenly over {num_packs} packs")
    quota = N // num_packs
    rows = np.arange(X)
    total_XN = load_WXN.sum(axis=0)
    owner = np.zeros((X, N), dtype=np.int64) if owner_XN is None else np.asarray(owner_XN, dtype=np.int64)
    num_owners = int(owner.max()) + 1
    # Heaviest first; ties by owner then item index, so equal replicas are placed together.
    order_XN = np.lexsort((np.broadcast_to(np.arange(N), (X, N)), owner, -total_XN), axis=1)
    item_XNW = np.moveaxis(load_WXN, 0, 2)  # [X, N, W]
    if W == 1 and refine:  # without refinement (the EPLB-style baseline) the greedy stays LPT
        pack_XN = _pack_rounds(total_XN, order_XN, owner, num_packs, owner_XN is not None)
        if pack_XN is not None:
            _refine_one_window(pack_XN, total_XN, owner if owner_XN is not None else None, num_packs)
            return pack_XN
    pack_load = np.zeros((X, num_packs, W))
    fill = np.zeros((X, num_packs), dtype=np.int64)
    holds = np.zeros((X, num_packs, num_owners), dtype=bool)
    pack_total = np.zeros((X, num_packs))
    peak = np.zeros((X, 1, W))
    pack_XN = np.full((X, N), -1, dtype=np.int64)
    for i in range(N):
        item = order_XN[:, i]
        v = item_XNW[rows, item]  # [X, W]
        own = owner[rows, item]
        ok = fill < quota
        if owner_XN is not None:
            ok &= ~holds[rows, :, own]
        if W == 1:  # one window: the lightest open pack (LPT), no need for the cost
            pick = np.argmin(np.where(ok, pack_total, np.inf), axis=1)
        else:
            cost = np.maximum(peak, pack_load + v[:, None, :]).sum(axis=2)  # [X, R]
            cost[~ok] = np.inf
            best = cost.min(axis=1, keepdims=True)
            tie = cost <= best + _REL_EPS * np.abs(best)
            pick = np.argmin(np.where(tie, pack_total, np.inf), axis=1)
        stuck = ~ok.any(axis=1)
        if stuck.any():
            for x in np.flatnonzero(stuck):
                pick[x] = _make_room(x, item[x], pack_XN, owner, holds, pack_load, item_XNW, fill, quota)
            pack_total = pack_load.sum(axis=2)
            peak = pack_load.max(axis=1, keepdims=True)
        pack_XN[rows, item] = pick
        pack_load[rows, pick] += v
        pack_total[rows, pick] += v.sum(axis=1)
        fill[rows, pick] += 1
        holds[rows, pick, own] = True
        peak[:, 0] = np.maximum(peak[:, 0], pack_load[rows, pick])
    if refine:
        _refine(pack_XN, item_XNW, owner if owner_XN is not None else None, num_packs)
    return pack_XN


def _pack_rounds(total_XN: np.ndarray, order_XN: np.ndarray, owner_XN: np.ndarray, num_packs: int,
                 distinct: bool) -> np.ndarray | None:
    """One window, vectorised across rows: every pack takes exactly one item per round, so in
    round k the k-th `num_packs` heaviest items go heaviest-first to the packs lightest-first
    (ties: the lower pack index), which keeps the quotas by construction. With `distinct`, an
    item whose pack already holds its owner takes the lightest free pack that does not (heavier
    items of the round keep theirs). None when a round cannot avoid a duplicate that way (the
    caller falls back to the item-by-item packer, which can always make room)."""
    X, N = total_XN.shape
    rows = np.arange(X)[:, None]
    pack_XN = np.full((X, N), -1, dtype=np.int64)
    pack_total = np.zeros((X, num_packs))
    holds = np.zeros((X, num_packs, int(owner_XN.max()) + 1), dtype=bool) if distinct else None
    for k in range(N // num_packs):
        items = order_XN[:, k * num_packs:(k + 1) * num_packs]  # heaviest first
        packs = np.argsort(pack_total, axis=1, kind="stable")  # lightest first, ties: the lower index
        if distinct:
            own = np.take_along_axis(owner_XN, items, 1)
            clash = holds[rows, packs, own]
            for x in np.flatnonzero(clash.any(axis=1)):
                fixed = _reassign_round(packs[x], own[x], holds[x])
                if fixed is None:
                    return None
                packs[x] = fixed
            holds[rows, packs, own] = True
        pack_XN[rows, items] = packs
        pack_total[rows, packs] += np.take_along_axis(total_XN, items, 1)
    return pack_XN


def _reassign_round(packs_R: np.ndarray, own_R: np.ndarray, holds_RO: np.ndarray) -> np.ndarray | None:
    """Items heaviest first, packs lightest first: each item takes its greedy pack if that pack
    lacks its owner, else the lightest pack still free that does; None if some item finds none."""
    free = list(packs_R)
    out = np.empty_like(packs_R)
    for i, own in enumerate(own_R):
        want = packs_R[i] if packs_R[i] in free and not holds_RO[packs_R[i], own] else next(
            (p for p in free if not holds_RO[p, own]), None)
        if want is None:
            return None
        out[i] = want
        free.remove(want)
    return out


def _make_room(x, item, pack_XN, owner, holds, pack_load, item_XNW, fill, quota) -> int:
    """Every pack with room already holds this item's owner: move one item j of a full pack t
    that lacks the owner into a pack o with room that lacks j's owner, and return t for the
    item. Always possible when replicas <= packs: a full pack has `quota` distinct owners, an
    open one fewer, so one of them is movable. Of all such moves, the one with the lowest
    objective after placing the item (ties: the lighter j, then the lower t, o): chosen by loads,
    never by expert ids, so renaming experts renames the layout."""
    own, v = owner[x, item], item_XNW[x, item]
    open_packs = np.flatnonzero(fill[x] < quota)
    best = None
    for t in np.flatnonzero(~holds[x, :, own]):
        for j in np.flatnonzero(pack_XN[x] == t):
            for o in open_packs:
                if holds[x, o, owner[x, j]]:
                    continue
                load = pack_load[x].copy()
                load[t] += v - item_XNW[x, j]
                load[o] += item_XNW[x, j]
                key = (float(load.max(axis=0).sum()), float(item_XNW[x, j].sum()), int(t), int(o))
                if best is None or key < best[0]:
                    best = (key, int(j))
    if best is None:
        raise PlanError("internal: no pack can take a replica without a duplicate")
    (_, _, t, o), j = best
    pack_XN[x, j] = o
    pack_load[x, t] -= item_XNW[x, j]
    pack_load[x, o] += item_XNW[x, j]
    fill[x, t] -= 1
    fill[x, o] += 1
    holds[x, t, owner[x, j]] = False
    holds[x, o, owner[x, j]] = True
    return t


def _objective(pack_load_XRW: np.ndarray) -> np.ndarray:
    return pack_load_XRW.max(axis=1).sum(axis=1)


def _pack_loads(pack_XN: np.ndarray, item_XNW: np.ndarray, num_packs: int) -> np.ndarray:
    X, N, W = item_XNW.shape
    out = np.zeros((X, num_packs, W))
    np.add.at(out, (np.repeat(np.arange(X), N), pack_XN.ravel()), item_XNW.reshape(X * N, W))
    return out


def _refine(pack_XN: np.ndarray, item_XNW: np.ndarray, owner_XN: np.ndarray | None, num_packs: int) -> None:
    """Pairwise swaps (in place): each round, per row, try every swap of an item of the pack that
    costs most (the busiest pack of the most windows, weighted by load) with any item of another
    pack; apply the best one if it lowers the objective. Rows that cannot improve stop."""
    X, N, W = item_XNW.shape
    quota = N // num_packs
    active = np.ones(X, dtype=bool)
    for _ in range(REFINE_MAX_ROUNDS):
        xs = np.flatnonzero(active)
        if not len(xs):
            break
        pk = pack_XN[xs]
        items = item_XNW[xs]
        load = _pack_loads(pk, items, num_packs)  # [x, R, W]
        obj = _objective(load)
        top = np.argmax(load, axis=1)  # [x, W] busiest pack per window
        blame = np.zeros((len(xs), num_packs))
        np.add.at(blame, (np.repeat(np.arange(len(xs)), W), top.ravel()), load.max(axis=1).ravel())
        a = np.argmax(blame, axis=1)  # [x]
        in_a = np.nonzero(pk == a[:, None])[1].reshape(len(xs), quota)  # items on pack a
        # Max over packs other than {a, b}, per window: from the three largest loads.
        srt = np.argsort(-load, axis=1, kind="stable")[:, :3]  # [x, 3, W]
        vals = np.take_along_axis(load, srt, 1)
        if num_packs < 3:
            vals = np.concatenate([vals, np.zeros((len(xs), 3 - num_packs, W))], axis=1)
            srt = np.concatenate([srt, np.full((len(xs), 3 - num_packs, W), -1)], axis=1)
        b = np.arange(num_packs)[None, :, None]  # [1, R, 1]
        excl = np.where((srt[:, 0:1] != a[:, None, None]) & (srt[:, 0:1] != b), vals[:, 0:1],
                        np.where((srt[:, 1:2] != a[:, None, None]) & (srt[:, 1:2] != b), vals[:, 1:2],
                                 vals[:, 2:3]))  # [x, R, W]
        vi = np.take_along_axis(items, in_a[:, :, None], 1)  # [x, S, W]
        rx = np.arange(len(xs))[:, None]
        la = load[rx[:, 0], a]  # [x, W]
        lb = load[rx, pk]  # [x, N, W] load of each item's pack
        new_a = la[:, None, None, :] - vi[:, :, None, :] + items[:, None, :, :]  # [x, S, N, W]
        new_b = lb[:, None, :, :] - items[:, None, :, :] + vi[:, :, None, :]
        rest = excl[rx, pk]  # [x, N, W]
        cand = np.maximum(np.maximum(new_a, new_b), rest[:, None, :, :]).sum(axis=3)  # [x, S, N]
        ok = (pk != a[:, None])[:, None, :]
        if owner_XN is not None:
            own = owner_XN[xs]
            own_a = np.take_along_axis(own, in_a, 1)  # [x, S]
            holds = np.zeros((len(xs), num_packs, int(own.max()) + 1), dtype=bool)
            holds[np.repeat(np.arange(len(xs)), N), pk.ravel(), own.ravel()] = True
            b_lacks_a_owner = ~holds[rx[:, :, None], pk[:, None, :], own_a[:, :, None]]  # [x, S, N]
            a_lacks_b_owner = ~holds[rx, a[:, None], own]  # [x, N]
            ok = ok & b_lacks_a_owner & a_lacks_b_owner[:, None, :]
        cand = np.where(ok, cand, np.inf).reshape(len(xs), -1)
        low = cand.min(axis=1, keepdims=True)
        # Among equally good swaps (common: another pack may set the peak), prefer the one that
        # evens the two packs most; this also keeps the choice independent of expert ids.
        spread = ((new_a ** 2).sum(axis=3) + (new_b ** 2).sum(axis=3)).reshape(len(xs), -1)
        best = np.argmin(np.where(cand <= low + _REL_EPS * np.abs(low), spread, np.inf), axis=1)
        gain = cand[np.arange(len(xs)), best] < obj * (1 - 1e-9) - 1e-12
        for k in np.flatnonzero(gain):
            s, j = divmod(int(best[k]), N)
            x = xs[k]
            i = in_a[k, s]
            pack_XN[x, i], pack_XN[x, j] = pack_XN[x, j], pack_XN[x, i]
        active[xs[~gain]] = False


def _refine_one_window(pack_XN: np.ndarray, load_XN: np.ndarray, owner_XN: np.ndarray | None, num_packs: int,
                       max_rounds: int = REFINE_MAX_ROUNDS, pairs: int = REFINE_PAIRS) -> None:
    """`_refine` for one window, cheaper (in place). Each round, per row, the `pairs`
    busiest packs pair up with as many lightest ones (the i-th busiest with the i-th lightest),
    and every pair makes at once its best swap of one item each: the one that brings the two
    loads closest to their mean (ties: the first item pair in slot order), when it lowers the
    heavier one. The pairs are disjoint, so the swaps never interact; a row goes on while its
    busiest pack improves. Items of each pack
    are kept as [pack, slot] arrays and swapped in place; `holds` [X, R, owners] answers "does
    this pack hold that owner" for the no-duplicate rule."""
    X, N = load_XN.shape
    quota = N // num_packs
    M = min(pairs, num_packs // 2)
    if M < 1 or max_rounds < 1:
        return
    slot = np.argsort(pack_XN, axis=1, kind="stable").reshape(X, num_packs, quota)  # items by pack
    vals = np.take_along_axis(load_XN, slot.reshape(X, N), 1).reshape(X, num_packs, quota)
    own = holds = None
    if owner_XN is not None:
        own = np.take_along_axis(owner_XN, slot.reshape(X, N), 1).reshape(X, num_packs, quota)
        holds = np.zeros((X, num_packs, int(own.max()) + 1), dtype=bool)
        holds[np.arange(X)[:, None, None], np.arange(num_packs)[None, :, None], own] = True
    tot = vals.sum(axis=2)
    active = np.arange(X)
    for _ in range(max_rounds):
        n = len(active)
        if not n:
            break
        xs = active[:, None]  # [n, 1]
        by_load = np.argsort(-tot[active], axis=1, kind="stable")  # busiest first, ties: lower index
        a, b = by_load[:, :M], by_load[:, : num_packs - M - 1 : -1]  # [n, M]: i-th busiest, i-th lightest
        va, vb = vals[xs, a], vals[xs, b]  # [n, M, q]
        la, lb = tot[xs, a], tot[xs, b]
        # Swapping a's item i for b's item j moves d = vb_j - va_i onto a, and the heavier of
        # the two becomes max(la + d, lb - d) = mean + |d - (lb - la) / 2|: the closest d wins.
        off = vb[:, :, None, :] - (va + ((lb - la) / 2)[:, :, None])[:, :, :, None]  # [n, M, q(a), q(b)]
        np.abs(off, out=off)
        if own is not None:
            oa, ob = own[xs, a], own[xs, b]
            a_in_b = holds[xs[:, :, None], b[:, :, None], oa]  # [n, M, q]: a's item's owner already in b
            b_in_a = holds[xs[:, :, None], a[:, :, None], ob]
            np.copyto(off, np.inf, where=a_in_b[:, :, :, None] | b_in_a[:, :, None, :])
        off = off.reshape(n, M, quota * quota)
        best = np.argmin(off, axis=2)  # [n, M]
        peak = (la + lb) / 2 + np.take_along_axis(off, best[:, :, None], 2)[:, :, 0]
        gain = peak < la * (1 - 1e-9) - 1e-12
        r, m = np.nonzero(gain)
        i, j = np.divmod(best[r, m], quota)
        x, pa, pb = active[r], a[r, m], b[r, m]
        d = vb[r, m, j] - va[r, m, i]
        if own is not None:
            oi, oj = own[x, pa, i], own[x, pb, j]
            holds[x, pa, oi] = holds[x, pb, oj] = False
            holds[x, pa, oj] = holds[x, pb, oi] = True
        for arr in (slot, vals) if own is None else (slot, vals, own):
            arr[x, pa, i], arr[x, pb, j] = arr[x, pb, j], arr[x, pa, i]
        tot[x, pa] += d
        tot[x, pb] -= d
        active = active[gain[:, 0]]
    pack_XN[np.arange(X)[:, None, None], slot] = np.arange(num_packs)[None, :, None]


def _slots_from_packs(expert_XN: np.ndarray, pack_XN: np.ndarray, num_packs: int) -> np.ndarray:
    """phy2log [X, N]: pack by pack, each pack's experts ascending (deterministic slot order)."""
    order = np.lexsort((expert_XN, pack_XN), axis=1)
    return np.take_along_axis(expert_XN, order, 1)


# ---- policies --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """Deployment shape. Slots per rank = (experts + redundant) / ranks."""

    num_ranks: int
    num_redundant: int = 0
    num_nodes: int = 1
    num_groups: int = 1  # expert groups (group-limited routing); packed on nodes when nodes > 1


def check_geometry(num_experts: int, geo: Geometry, no_duplicates: bool = True) -> None:
    """UsageError naming the flag when a deployment shape cannot be laid out."""
    R, N, G = geo.num_ranks, geo.num_nodes, geo.num_groups
    P = num_experts + geo.num_redundant
    if R < 1 or N < 1 or G < 1 or geo.num_redundant < 0:
        raise UsageError(f"--ranks, --nodes, --groups must be >= 1 and --redundant >= 0, "
                         f"got ranks={R} nodes={N} groups={G} redundant={geo.num_redundant}")
    if P % R:
        raise UsageError(f"--ranks {R} does not divide {num_experts} experts + {geo.num_redundant} redundant = {P}",
                         "choose --redundant so that experts + redundant is a multiple of --ranks")
    if R % N:
        raise UsageError(f"--nodes {N} does not divide --ranks {R}")
    if N > 1:
        if num_experts % G:
            raise UsageError(f"--groups {G} does not divide {num_experts} experts")
        if G % N:
            raise UsageError(f"--nodes {N} does not divide --groups {G}", "use --groups as a multiple of --nodes")
        if (P // N) < num_experts // N:
            raise UsageError("internal: fewer slots than experts per node")
    per_rank = P // R
    if no_duplicates and per_rank > num_experts // N:
        raise UsageError(f"{per_rank} slots per rank exceed the {num_experts // N} experts a node can hold once",
                         "lower --redundant or raise --ranks")
    if no_duplicates and P // N > (num_experts // N) * (R // N):
        raise UsageError(f"--redundant {geo.num_redundant} needs more replicas than ranks per node")


def place_experts(windows_WLE: np.ndarray, layers, geo: Geometry) -> Placement:
    """hotsplit's layout: window-aware, no duplicate replica on a rank, hierarchical when nodes > 1.

    windows_WLE: routed-assignment counts per window (float [W, L, E]; W = 1 for totals only).
    """
    windows_WLE = check_windows(windows_WLE)
    check_geometry(windows_WLE.shape[2], geo)
    phy2log = hierarchical_phy2log(windows_WLE, geo, no_duplicates=True, replicate_cap=True, refine=True)
    return Placement(tuple(int(x) for x in layers), geo.num_ranks, phy2log, "hotsplit", geo.num_nodes)


def hierarchical_phy2log(windows_WLE: np.ndarray, geo: Geometry, no_duplicates: bool, replicate_cap: bool,
                         refine: bool) -> np.ndarray:
    """phy2log [L, P] of checked counts [W, L, E]: expert groups packed on nodes (nodes > 1),
    then replicas and packing on the ranks of each node. `no_duplicates`: never two replicas of
    an expert on a rank; `replicate_cap`: never more replicas than ranks per node; `refine`:
    pairwise swaps after the greedy packing."""
    W, L, E = windows_WLE.shape
    N = geo.num_nodes
    P = E + geo.num_redundant
    ranks_per_node = geo.num_ranks // N
    if N == 1:
        node_experts_LNE = np.broadcast_to(np.arange(E), (L, 1, E))
    else:
        G = geo.num_groups
        gsize = E // G
        group_WLG = windows_WLE.reshape(W, L, G, gsize).sum(axis=3)
        node_LG = pack_items(group_WLG, N, refine=refine)
        # Experts of the groups on each node, groups ascending: [L, N, E / N].
        groups_LNg = _slots_from_packs(np.broadcast_to(np.arange(G), (L, G)), node_LG, N).reshape(L, N, G // N)
        node_experts_LNE = (groups_LNg[..., None] * gsize + np.arange(gsize)).reshape(L, N, E // N)
    Ek = node_experts_LNE.shape[2]
    X = L * N
    experts_XE = np.ascontiguousarray(node_experts_LNE).reshape(X, Ek)
    w_WXE = np.take_along_axis(np.repeat(windows_WLE, N, axis=1), experts_XE[None], 2)  # [W, X, Ek]
    logcnt = replicate_experts(w_WXE.sum(axis=0), P // N, ranks_per_node if replicate_cap else None)
    local_XP = expand_replicas(logcnt)  # local expert index of each item
    per_item = np.take_along_axis(w_WXE, local_XP[None], 2) / np.take_along_axis(logcnt, local_XP, 1)[None]
    pack = pack_items(per_item, ranks_per_node, local_XP if no_duplicates else None, refine=refine)
    local_slots = _slots_from_packs(local_XP, pack, ranks_per_node)
    return np.take_along_axis(experts_XE, local_slots, 1).reshape(L, P)


def check_windows(windows_WLE: np.ndarray) -> np.ndarray:
    """Counts as float [W, L, E], refused (PlanError) when not 3-d, empty, negative or not finite."""
    a = np.asarray(windows_WLE, dtype=np.float64)
    if a.ndim != 3 or 0 in a.shape:
        raise PlanError(f"expected counts [windows, layers, experts], got shape {a.shape}")
    check_finite_nonneg(a, PlanError, lambda *_: "counts must be finite and >= 0")
    return a
