"""The packer's rules, exactly: each vectorised step of hotsplit_cli/placement/algorithm.py is
compared with the same rule written out as plain Python loops from its docstring, on random
small rows (several rows at once, so a step that mixes rows up shows), and its state after a move
is checked field by field."""

from __future__ import annotations

import numpy as np
import pytest

import hotsplit_cli.placement.algorithm as algo
from hotsplit_cli.core.errors import PlanError

EPS = algo._REL_EPS


# ---- references --------------------------------------------------------------------------------


def ref_order(total_N, owner_N):
    """Heaviest first; ties by owner, then item index."""
    return sorted(range(len(total_N)), key=lambda i: (-total_N[i], owner_N[i], i))


def ref_reassign_round(packs, owners, holds):
    free = list(packs)
    out = []
    for i, own in enumerate(owners):
        if packs[i] in free and not holds[packs[i]][own]:
            want = packs[i]
        else:
            want = next((p for p in free if not holds[p][own]), None)
        if want is None:
            return None
        out.append(want)
        free.remove(want)
    return out


def ref_pack_rounds(total_N, owner_N, num_packs, distinct):
    """One row: round k gives the k-th `num_packs` heaviest items, heaviest first, to the packs
    lightest first (ties: lower index), moving a clashing replica as `ref_reassign_round` does."""
    order = ref_order(total_N, owner_N)
    pack = [-1] * len(total_N)
    tot = [0.0] * num_packs
    holds = [[False] * (max(owner_N) + 1) for _ in range(num_packs)]
    for k in range(len(total_N) // num_packs):
        items = order[k * num_packs:(k + 1) * num_packs]
        packs = sorted(range(num_packs), key=lambda p: (tot[p], p))
        if distinct:
            owners = [owner_N[i] for i in items]
            if any(holds[p][o] for p, o in zip(packs, owners, strict=True)):
                packs = ref_reassign_round(packs, owners, holds)
                if packs is None:
                    return None
            for p, o in zip(packs, owners, strict=True):
                holds[p][o] = True
        for i, p in zip(items, packs, strict=True):
            pack[i] = p
        for i, p in zip(items, packs, strict=True):
            tot[p] += total_N[i]
    return pack


def ref_make_room(item, pack, owner, holds, load, item_NW, fill, quota):
    """The move `_make_room` must choose, as (t, o, j): every full-or-not pack t lacking the
    item's owner, every j in t, every open pack o lacking j's owner; lowest (objective, load of j,
    t, o), first j on a tie."""
    own, v = owner[item], item_NW[item]
    best = None
    R = len(fill)
    for t in range(R):
        if holds[t, own]:
            continue
        for j in range(len(pack)):
            if pack[j] != t:
                continue
            for o in range(R):
                if fill[o] >= quota or holds[o, owner[j]]:
                    continue
                trial = load.copy()
                trial[t] += v - item_NW[j]
                trial[o] += item_NW[j]
                key = (float(trial.max(axis=0).sum()), float(item_NW[j].sum()), t, o)
                if best is None or key < best[0]:
                    best = (key, j)
    return best[0][2], best[0][3], best[1]


def ref_refine(pack, item_NW, owner, num_packs):
    """One row of `_refine`: swap an item of the pack that costs most with an item of another
    pack, the swap that lowers sum over windows of the busiest pack's load most (ties within
    _REL_EPS: the one that evens the two packs most, then the first), while it lowers it."""
    N, W = item_NW.shape
    pack = list(pack)
    for _ in range(algo.REFINE_MAX_ROUNDS):
        load = np.zeros((num_packs, W))
        for i in range(N):
            load[pack[i]] += item_NW[i]
        obj = sum(max(load[r, w] for r in range(num_packs)) for w in range(W))
        blame = [0.0] * num_packs
        for w in range(W):
            top = max(range(num_packs), key=lambda r: (load[r, w], -r))
            blame[top] += load[top, w]
        a = max(range(num_packs), key=lambda r: (blame[r], -r))
        in_a = [i for i in range(N) if pack[i] == a]
        cands = []
        for s in in_a:
            for j in range(N):
                b = pack[j]
                if b == a:
                    continue
                if owner is not None and (any(owner[m] == owner[s] for m in range(N) if pack[m] == b)
                                          or any(owner[m] == owner[j] for m in range(N) if pack[m] == a)):
                    continue
                new_a = [load[a, w] - item_NW[s, w] + item_NW[j, w] for w in range(W)]
                new_b = [load[b, w] - item_NW[j, w] + item_NW[s, w] for w in range(W)]
                rest = [max([load[r, w] for r in range(num_packs) if r not in (a, b)], default=0.0)
                        for w in range(W)]
                cand = sum(max(new_a[w], new_b[w], rest[w]) for w in range(W))
                spread = sum(x * x for x in new_a) + sum(x * x for x in new_b)
                cands.append((cand, spread, s, j))
        if not cands:
            break
        low = min(c[0] for c in cands)
        tied = [c for c in cands if c[0] <= low + EPS * abs(low)]
        cand, _, s, j = min(tied, key=lambda c: c[1])  # the first of the least spread
        if not cand < obj * (1 - 1e-9) - 1e-12:
            break
        pack[s], pack[j] = pack[j], pack[s]
    return pack


def ref_refine_one_window(pack, load_N, owner, num_packs, pairs=algo.REFINE_PAIRS, rounds=algo.REFINE_MAX_ROUNDS):
    """One row of `_refine_one_window`: the items of each pack kept in slots (by item index).
    Each round orders the packs by load (ties by index) and pairs the m-th busiest with the m-th
    lightest, m < min(pairs, packs // 2); each pair takes the swap of one item each whose heavier
    side, mean + |d - (lb - la) / 2|, is least (ties: the first (i, j) in slot order), if it lowers
    the heavier pack; every pair's swap applies at once; rounds go on while the busiest pack's
    pair improves."""
    N = len(pack)
    quota = N // num_packs
    M = min(pairs, num_packs // 2)
    if M < 1 or rounds < 1:
        return list(pack)
    slots = [[i for i in range(N) if pack[i] == p] for p in range(num_packs)]
    tot = [float(np.sum(np.array([load_N[i] for i in s]))) for s in slots]  # numpy's sum, as the code
    for _ in range(rounds):
        by_load = sorted(range(num_packs), key=lambda p: (-tot[p], p))
        swaps, busiest_moved = [], False
        for m in range(M):
            a, b = by_load[m], by_load[num_packs - 1 - m]
            best = None
            for i in range(quota):
                for j in range(quota):
                    ia, jb = slots[a][i], slots[b][j]
                    if owner is not None and (owner[ia] in [owner[x] for x in slots[b]]
                                              or owner[jb] in [owner[x] for x in slots[a]]):
                        continue
                    off = abs(load_N[jb] - (load_N[ia] + (tot[b] - tot[a]) / 2))  # the code's float steps
                    if best is None or off < best[0]:
                        best = (off, i, j)
            if best is None:
                continue
            off, i, j = best
            if (tot[a] + tot[b]) / 2 + off < tot[a] * (1 - 1e-9) - 1e-12:
                swaps.append((a, b, i, j, load_N[slots[b][j]] - load_N[slots[a][i]]))
                busiest_moved |= m == 0
        for a, b, i, j, d in swaps:
            slots[a][i], slots[b][j] = slots[b][j], slots[a][i]
            tot[a] += d
            tot[b] -= d
        if not busiest_moved:
            break
    out = [-1] * N
    for p, s in enumerate(slots):
        for i in s:
            out[i] = p
    return out


def ref_greedy(load_WN, owner, num_packs):
    """One row of the item-by-item packer: items heaviest first; W = 1: the lightest open pack;
    W > 1: the open pack that least raises sum over windows of the busiest pack's load (ties
    within _REL_EPS: the lighter pack, then the lower index); `owner` None allows duplicates; a
    stuck item takes the pack `ref_make_room` empties."""
    W, N = load_WN.shape
    quota = N // num_packs
    own = [0] * N if owner is None else list(owner)
    order = ref_order(load_WN.sum(axis=0).tolist(), own)
    pack = np.full(N, -1)
    load = np.zeros((num_packs, W))
    fill = np.zeros(num_packs, dtype=np.int64)
    holds = np.zeros((num_packs, max(own) + 1), dtype=bool)
    total = np.zeros(num_packs)
    peak = np.zeros(W)
    item_NW = load_WN.T
    for i in order:
        v = item_NW[i]
        ok = [fill[p] < quota and (owner is None or not holds[p, own[i]]) for p in range(num_packs)]
        if not any(ok):
            t, o, j = ref_make_room(i, pack, np.array(own), holds, load, item_NW, fill, quota)
            pack[j] = o
            load[t] -= item_NW[j]
            load[o] += item_NW[j]
            fill[t] -= 1
            fill[o] += 1
            holds[t, own[j]], holds[o, own[j]] = False, True
            total, peak = load.sum(axis=1), load.max(axis=0)
            pick = t
        elif W == 1:
            pick = min((p for p in range(num_packs) if ok[p]), key=lambda p: (total[p], p))
        else:
            cost = {p: sum(max(peak[w], load[p, w] + v[w]) for w in range(W)) for p in range(num_packs) if ok[p]}
            best = min(cost.values())
            pick = min((p for p in cost if cost[p] <= best + EPS * abs(best)), key=lambda p: (total[p], p))
        pack[i] = pick
        load[pick] += v
        total[pick] += float(np.sum(v))
        fill[pick] += 1
        holds[pick, own[i]] = True
        peak = np.maximum(peak, load[pick])
    return pack.tolist()


def ref_pack_items(load_WN, owner, num_packs, refine=True):
    """One row of `pack_items`: with one window and refinement, the rounds then the one-window
    refinement (the item-by-item packer when the rounds give up); otherwise the item-by-item
    packer, then the window refinement when asked."""
    W, N = load_WN.shape
    own = [0] * N if owner is None else list(owner)
    if W == 1 and refine:
        pack = ref_pack_rounds(load_WN[0].tolist(), own, num_packs, owner is not None)
        if pack is not None:
            return ref_refine_one_window(pack, load_WN[0].tolist(), owner, num_packs)
    pack = ref_greedy(load_WN, owner, num_packs)
    return ref_refine(pack, load_WN.T, owner, num_packs) if refine else pack


def ref_place(windows_WLE, R, redundant, nodes=1, groups=1, cap=True, distinct=True, refine=True):
    """phy2log [L, P] as place_experts / eplb_layout build it, from the reference steps: groups
    packed on nodes by their loads, then per node the replicas (one each, then each extra slot to
    the largest load per replica, lowest id on ties, at most ranks-per-node when capped), packed
    on the node's ranks; each rank's slots hold its experts ascending."""
    W, L, E = windows_WLE.shape
    P, Rn = E + redundant, R // nodes
    out = []
    for layer in range(L):
        w = windows_WLE[:, layer]
        if nodes == 1:
            node_experts = [list(range(E))]
        else:
            g = E // groups
            gload = w.reshape(W, groups, g).sum(axis=2)
            gpack = ref_pack_items(gload, None, nodes, refine)
            node_experts = [[x * g + k for x in range(groups) if gpack[x] == n for k in range(g)]
                            for n in range(nodes)]
        row = []
        for experts in node_experts:
            wn = w[:, experts]
            cnt = [1] * len(experts)
            tot = wn.sum(axis=0)
            for _ in range(P // nodes - len(experts)):
                cand = [e for e in range(len(experts)) if not cap or cnt[e] < Rn]
                cnt[max(cand, key=lambda e: (tot[e] / cnt[e], -e))] += 1
            items = [e for e in range(len(experts)) for _ in range(cnt[e])]
            per = np.stack([wn[:, e] / cnt[e] for e in items], axis=1)
            pack = ref_pack_items(per, items if distinct else None, Rn, refine)
            for r in range(Rn):
                row += sorted(experts[items[i]] for i in range(len(items)) if pack[i] == r)
        out.append(row)
    return out


# ---- random rows -------------------------------------------------------------------------------


def rows(seed, X, E, R, S, W, ties=False):
    """X rows of E experts with replicas filling R packs of S slots: loads per window [W, X, N],
    owners [X, N] (grouped by expert, as `expand_replicas` gives) and a random valid packing
    (quotas kept, no owner twice in a pack)."""
    rng = np.random.default_rng(seed)
    N = R * S
    weights = rng.integers(1, 4, size=(W, X, E)).astype(float) if ties else rng.gamma(0.5, 100.0, size=(W, X, E))
    cnt = algo.replicate_experts(weights.sum(axis=0), N, R)
    owner = algo.expand_replicas(cnt)
    load = np.take_along_axis(weights, owner[None], 2) / np.take_along_axis(cnt, owner, 1)[None]
    pack = np.stack([_valid_packing(rng, owner[x], R, S) for x in range(X)])
    return load, owner, pack


def _valid_packing(rng, owner_N, R, S):
    for _ in range(1000):
        perm = rng.permutation(len(owner_N))
        pack = np.empty(len(owner_N), dtype=np.int64)
        pack[perm] = np.arange(len(owner_N)) // S
        if all(len(set(owner_N[pack == p])) == S for p in range(R)):
            return pack
    raise AssertionError("no valid packing drawn")


CASES = [(seed, X, E, R, S, W) for seed, (X, E, R, S, W) in enumerate(
    [(3, 6, 3, 3, 2), (2, 8, 4, 3, 3), (3, 5, 2, 4, 1), (2, 9, 3, 4, 2), (2, 7, 5, 2, 3), (3, 10, 4, 3, 1),
     (2, 6, 6, 2, 2), (2, 12, 4, 4, 2)])]


# ---- the tests ---------------------------------------------------------------------------------


def test_a_clashing_replica_leaves_a_free_greedy_pack_to_the_item_it_was_meant_for():
    holds = np.zeros((3, 6), dtype=bool)
    holds[0, 3] = holds[1, 3] = True  # packs 0 and 1 already hold expert 3
    # expert 3 (greedy pack 0) must go to pack 2; expert 4 keeps its greedy pack 1, not pack 0
    assert algo._reassign_round(np.array([0, 1, 2]), np.array([3, 4, 5]), holds).tolist() == [2, 1, 0]
    assert ref_reassign_round([0, 1, 2], [3, 4, 5], holds) == [2, 1, 0]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_one_window_rounds_follow_the_rule(case, ties):
    seed, X, E, R, S, _ = case
    load, owner, _ = rows(seed, X, E, R, S, 1, ties)
    total = load.sum(axis=0)
    order = np.lexsort((np.broadcast_to(np.arange(R * S), (X, R * S)), owner, -total), axis=1)
    for distinct in (True, False):
        got = algo._pack_rounds(total, order, owner, R, distinct)
        want = [ref_pack_rounds(total[x].tolist(), owner[x].tolist(), R, distinct) for x in range(X)]
        if any(w is None for w in want):
            assert got is None
        else:
            assert got.tolist() == want


def test_rounds_that_cannot_avoid_a_duplicate_give_up():
    # 2 packs, expert 0 three times: round 2 finds both packs holding it.
    total = np.array([[5.0, 5.0, 5.0, 1.0]])
    owner = np.array([[0, 0, 0, 1]])
    order = np.array([[0, 1, 2, 3]])
    assert algo._pack_rounds(total, order, owner, 2, True) is None
    assert algo._pack_rounds(total, order, owner, 2, False).tolist() == [[0, 1, 0, 1]]


@pytest.mark.parametrize("case", CASES)
def test_the_window_refinement_follows_the_rule(case):
    seed, X, E, R, S, W = case
    load, owner, pack = rows(seed, X, E, R, S, W)
    item_XNW = np.moveaxis(load, 0, 2)
    for own in (owner, None):
        got = pack.copy()
        algo._refine(got, item_XNW, own, R)
        want = [ref_refine(pack[x].tolist(), item_XNW[x], None if own is None else own[x].tolist(), R)
                for x in range(X)]
        assert got.tolist() == want


@pytest.mark.parametrize("case", CASES)
def test_the_one_window_refinement_follows_the_rule(case):
    seed, X, E, R, S, _ = case
    load, owner, pack = rows(seed, X, E, R, S, 1)
    total = load[0]
    for own in (owner, None):
        for pairs in (1, 2, algo.REFINE_PAIRS):
            got = pack.copy()
            algo._refine_one_window(got, total, own, R, pairs=pairs)
            want = [ref_refine_one_window(pack[x].tolist(), total[x].tolist(),
                                          None if own is None else own[x].tolist(), R, pairs) for x in range(X)]
            assert got.tolist() == want


def test_the_one_window_refinement_stops_after_its_rounds():
    load, owner, pack = rows(1, 2, 8, 4, 3, 1)
    for rounds in (0, 1, 2):
        got = pack.copy()
        algo._refine_one_window(got, load[0], owner, 4, max_rounds=rounds)
        want = [ref_refine_one_window(pack[x].tolist(), load[0, x].tolist(), owner[x].tolist(), 4, rounds=rounds)
                for x in range(2)]
        assert got.tolist() == want
    assert (got != pack).any()  # the cases do move something


def test_make_room_moves_the_cheapest_item_and_keeps_the_books(monkeypatch):
    """Spy on every `_make_room` the item-by-item packer calls on random rows with several
    replicas per expert: the move is the reference's, and the pack's loads, fills and owner sets
    after it are those of the packing that results."""
    real = algo._make_room
    calls = []

    def checked(x, item, pack_XN, owner, holds, pack_load, item_XNW, fill, quota):
        before = (pack_XN[x].copy(), holds[x].copy(), pack_load[x].copy(), fill[x].copy())
        t_want, o_want, j_want = ref_make_room(item, pack_XN[x], owner[x], holds[x], pack_load[x], item_XNW[x],
                                               fill[x], quota)
        t = real(x, item, pack_XN, owner, holds, pack_load, item_XNW, fill, quota)
        assert (t, int(np.flatnonzero(pack_XN[x] != before[0])[0])) == (t_want, j_want)
        assert pack_XN[x, j_want] == o_want
        placed = pack_XN[x] >= 0
        loads = np.zeros_like(before[2])
        np.add.at(loads, pack_XN[x][placed], item_XNW[x][placed])
        assert np.allclose(pack_load[x], loads, rtol=0, atol=1e-9)
        assert fill[x].tolist() == np.bincount(pack_XN[x][placed], minlength=len(fill[x])).tolist()
        want_holds = np.zeros_like(before[1])
        want_holds[pack_XN[x][placed], owner[x][placed]] = True
        assert (holds[x] == want_holds).all()
        calls.append(t)
        return t

    monkeypatch.setattr(algo, "_make_room", checked)
    for (E, R, S, W), seeds in STUCK.items():
        for seed in seeds:
            w = np.random.default_rng(seed).gamma(0.5, size=(W, 2, E)) * 1000 + 1e-3
            cnt = algo.replicate_experts(w.sum(axis=0), R * S, R)
            owner = algo.expand_replicas(cnt)
            load = np.take_along_axis(w, owner[None], 2) / np.take_along_axis(cnt, owner, 1)[None]
            algo.pack_items(load, R, owner, refine=False)
    assert len(calls) == sum(map(len, STUCK.values()))  # each of these rows gets stuck once


# (experts, ranks, slots per rank, windows) -> seeds of heavy-tailed loads (as test_place.py's
# `cases` draws them) where the item-by-item packer finds every open rank holding the expert.
STUCK = {(10, 5, 6, 3): (3, 36, 114, 137), (10, 5, 7, 3): (13, 23, 27, 41, 47, 55), (8, 4, 5, 3): (3, 69, 145),
         (9, 3, 7, 3): (82, 147)}


def test_make_room_without_a_movable_item_is_an_internal_error():
    holds = np.ones((1, 2, 2), dtype=bool)
    with pytest.raises(PlanError) as exc:
        algo._make_room(0, 0, np.array([[-1, 0, 1, 1]]), np.array([[0, 1, 0, 1]]), holds, np.zeros((1, 2, 1)),
                        np.ones((1, 4, 1)), np.array([[1, 2]]), 2)
    assert exc.value.message == "internal: no pack can take a replica without a duplicate"


def test_make_room_looks_past_an_open_pack_that_holds_the_movers_expert():
    """Expert A's third replica finds both open packs holding A. Of pack 0's items, B (load 5)
    cannot go to pack 1 (which holds a B) but can go to pack 2, and that is the best move:
    busiest pack 7 after placing A, where moving C or D leaves pack 0 at 8."""
    A, B, C, D, E, F = range(6)
    owner = np.array([[B, C, D, A, B, A, A, E, F]])
    pack = np.array([[0, 0, 0, 1, 1, 2, -1, -1, -1]])
    item = np.array([5.0, 1, 1, 2, 5, 2, 2, 1, 1]).reshape(1, 9, 1)
    fill = np.array([[3, 2, 1]])
    holds = np.zeros((1, 3, 6), dtype=bool)
    holds[0, pack[0, :6], owner[0, :6]] = True
    load = np.array([[[7.0], [7.0], [2.0]]])
    assert algo._make_room(0, 6, pack, owner, holds, load, item, fill, 3) == 0
    assert pack.tolist() == [[2, 0, 0, 1, 1, 2, -1, -1, -1]]
    assert load[0, :, 0].tolist() == [2.0, 7.0, 7.0] and fill.tolist() == [[2, 2, 2]]
    assert holds[0, :, B].tolist() == [False, True, True]


def test_the_objective_sums_the_busiest_pack_over_windows_per_row():
    load = np.array([[[1.0, 5.0], [3.0, 2.0]], [[0.0, 0.0], [4.0, 1.0]]])  # [X=2, R=2, W=2]
    assert algo._objective(load).tolist() == [3.0 + 5.0, 4.0 + 1.0]


def test_invert_phy2log_per_row_and_its_width():
    phy2log = np.array([[0, 1, 2], [2, 0, 1]])
    out = algo.invert_phy2log(phy2log, 3)
    assert out.shape == (2, 3, 1) and out[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 0]]
    out = algo.invert_phy2log(np.array([[1, 0, 1, 1], [0, 0, 1, 0]]), 2)
    assert out.tolist() == [[[1, -1, -1], [0, 2, 3]], [[0, 1, 3], [2, -1, -1]]]


@pytest.mark.parametrize("scale", [1.0, 2.0 ** -40])  # tiny loads: the tie tolerance is relative
@pytest.mark.parametrize("case", CASES)
def test_pack_items_follows_the_rule(case, scale):
    seed, X, E, R, S, W = case
    load, owner, _ = rows(seed, X, E, R, S, W)
    load = load * scale
    for own in (owner, None):
        for refine in (True, False):
            got = algo.pack_items(load, R, own, refine=refine)
            want = [ref_pack_items(load[:, x], None if own is None else own[x].tolist(), R, refine) for x in range(X)]
            assert got.tolist() == want, (own is None, refine)
    assert algo.pack_items(load, R, owner).tolist() == algo.pack_items(load, R, owner, refine=True).tolist()


@pytest.mark.parametrize("W", [1, 2])
def test_rows_without_traffic_keep_the_quotas(W):
    load, owner, _ = rows(0, 2, 6, 3, 3, W)
    load[:, 0] = 0.0  # a layer that saw no token
    for own in (owner, None):
        got = algo.pack_items(load, 3, own, refine=False)
        assert [np.bincount(r, minlength=3).tolist() for r in got] == [[3, 3, 3]] * 2
        assert got.tolist() == [ref_pack_items(load[:, x], None if own is None else own[x].tolist(), 3, False)
                                for x in range(2)]


@pytest.mark.parametrize("W", [1, 3])
@pytest.mark.parametrize("nodes, groups", [(1, 1), (2, 4), (2, 2)])
def test_place_experts_is_the_reference_pipeline(W, nodes, groups):
    rng = np.random.default_rng(W * 10 + nodes + groups)
    windows = rng.gamma(0.5, 100.0, size=(W, 3, 8))
    geo = algo.Geometry(4, 4, nodes, groups)
    p = algo.place_experts(windows, (3, 4, 5), geo)
    assert (p.layers, p.num_ranks, p.method, p.num_nodes) == ((3, 4, 5), 4, "hotsplit", nodes)
    assert p.phy2log_LP.tolist() == ref_place(windows, 4, 4, nodes, groups)


@pytest.mark.parametrize("nodes, groups", [(1, 1), (2, 4)])
def test_the_totals_only_baseline_is_the_reference_pipeline_uncapped_with_duplicates(nodes, groups):
    from hotsplit_cli.placement.evaluate import eplb_layout

    counts = np.random.default_rng(nodes).gamma(0.5, 100.0, size=(3, 8))
    counts[1, 2] = 1e5  # one expert hot enough for more replicas than a node has ranks
    geo = algo.Geometry(4, 8, nodes, groups)
    p = eplb_layout(counts, (0, 1, 2), geo)
    assert p.phy2log_LP.tolist() == ref_place(counts[None], 4, 8, nodes, groups, cap=False, distinct=False,
                                              refine=False)
    assert p.logcnt_LE(8)[1, 2] > 4 // nodes


@pytest.mark.parametrize("nodes, groups", [(1, 1), (4, 8)])
def test_the_totals_only_baseline_gives_eplbs_ranks(nodes, groups):
    """On counts without ties, each rank of the EPLB-style baseline holds what it holds in the
    port of the EPLB reference (benchmarks/eplb_port.py, which SGLang's shipped `deepseek`
    matches slot for slot on such counts: docs/benchmarks.md)."""
    from hotsplit_cli.placement.evaluate import eplb_layout
    from tests.conftest import load_benchmark

    port = load_benchmark("eplb_port")
    counts = np.random.default_rng(5).gamma(0.5, 1e4, size=(4, 32))
    p = eplb_layout(counts, range(4), algo.Geometry(8, 16, nodes, groups))
    ref = port.rebalance_experts(counts, 48, groups, nodes, 8)[0]
    assert (np.sort(p.phy2log_LP.reshape(4, 8, 6), axis=2) == np.sort(ref.reshape(4, 8, 6), axis=2)).all()


def test_the_primitives_say_what_cannot_be_laid_out():
    with pytest.raises(PlanError) as exc:
        algo.replicate_experts(np.ones((1, 4)), 3)
    assert exc.value.message == "3 physical slots cannot hold 4 logical experts"
    with pytest.raises(PlanError) as exc:
        algo.replicate_experts(np.ones((1, 4)), 9, max_replicas=2)
    assert exc.value.message == "9 slots exceed 4 experts x 2 replicas"
    with pytest.raises(PlanError) as exc:
        algo.pack_items(np.ones((1, 1, 7)), 2)
    assert exc.value.message == "7 items do not split evenly over 2 packs"


def test_one_window_packing_without_owners_still_refines():
    """Duplicates allowed (owner None: the node packing of expert groups, the EPLB-style rows):
    the rounds are refined too, by swaps no owner rule forbids."""
    moved = 0
    for seed in range(12):
        load, _, _ = rows(seed, 2, 9, 3, 3, 1)
        got = algo.pack_items(load, 3, None)
        want = [ref_pack_items(load[:, x], None, 3) for x in range(2)]
        assert got.tolist() == want
        rounds = [ref_pack_rounds(load[0, x].tolist(), [0] * 9, 3, False) for x in range(2)]
        moved += sum(g != r for g, r in zip(want, rounds, strict=True))
    assert moved  # the refinement does change some of these


@pytest.mark.parametrize("case", CASES[:4])
def test_the_one_window_refinement_with_exact_ties_at_a_small_scale(case):
    """Whole-number loads (exact ties) scaled by 2**-30: the rule holds at any scale."""
    seed, X, E, R, S, _ = case
    load, owner, pack = rows(seed, X, E, R, S, 1, ties=True)
    total = load[0] * 2.0 ** -30
    got = pack.copy()
    algo._refine_one_window(got, total, owner, R)
    assert got.tolist() == [ref_refine_one_window(pack[x].tolist(), total[x].tolist(), owner[x].tolist(), R)
                            for x in range(X)]


def test_the_totals_only_baseline_packs_groups_on_nodes_without_refining():
    """Group loads 8, 7, 6, 5, 4, 1 on 2 nodes of 3 groups: the greedy puts 8, 5, 4 together (17);
    the refined packing of `place` reaches 16. The EPLB-style baseline keeps the greedy's."""
    from hotsplit_cli.placement.evaluate import eplb_layout

    counts = np.array([[8.0, 7, 6, 5, 4, 1]])
    base = eplb_layout(counts, (0,), algo.Geometry(2, 0, 2, 6))
    assert sorted(base.phy2log_LP[0, :3].tolist()) == [0, 3, 4]
    assert base.phy2log_LP.tolist() == ref_place(counts[None], 2, 0, 2, 6, cap=False, distinct=False, refine=False)
    refined = algo.place_experts(counts[None], (0,), algo.Geometry(2, 0, 2, 6))
    assert max(counts[0, refined.phy2log_LP[0, :3]].sum(), counts[0, refined.phy2log_LP[0, 3:]].sum()) == 16


@pytest.mark.parametrize("case, ties", [((0, 2, 36, 18, 4), False), ((0, 3, 40, 20, 3), True)])
def test_the_one_window_refinement_follows_the_rule_with_many_packs(case, ties):
    """More than 16 packs: numpy sorts short arrays stably whatever the kind, longer ones only when
    asked, so ties between pack loads are ordered by index only if the code says so; and enough
    rounds with owners that an owner table left unswapped would let a later swap duplicate one."""
    seed, X, E, R, S = case
    load, owner, pack = rows(seed, X, E, R, S, 1, ties=ties)
    got = pack.copy()
    algo._refine_one_window(got, load[0], owner, R)
    assert got.tolist() == [ref_refine_one_window(pack[x].tolist(), load[0, x].tolist(), owner[x].tolist(), R)
                            for x in range(X)]
