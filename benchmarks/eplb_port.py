"""A straightforward numpy port of the EPLB reference algorithm (deepseek-ai/EPLB, `eplb.py`),
written from its description, used only as the timing and quality baseline of the benchmarks.

Same structure as the reference: Python loops over layers and items, a `min` over packs for every
item, and one argmax over all layers per redundant slot. Hierarchical when groups divide nodes,
else one node and one group (the reference's global policy).
"""

from __future__ import annotations

import numpy as np


def balanced_packing(weight, num_packs):
    """Pack index and rank in pack of every item [X, n]; each pack gets n / num_packs items."""
    X, n = weight.shape
    per_pack = n // num_packs
    pack_index = np.full((X, n), -1, dtype=np.int64)
    rank_in_pack = np.full((X, n), -1, dtype=np.int64)
    if per_pack == 1:
        pack_index[:] = np.arange(n)
        rank_in_pack[:] = 0
        return pack_index, rank_in_pack
    for i in range(X):
        loads = [0.0] * num_packs
        sizes = [0] * num_packs
        for item in np.argsort(-weight[i], kind="stable").tolist():
            pack = min((p for p in range(num_packs) if sizes[p] < per_pack), key=loads.__getitem__)
            pack_index[i, item] = pack
            rank_in_pack[i, item] = sizes[pack]
            loads[pack] += float(weight[i, item])
            sizes[pack] += 1
    return pack_index, rank_in_pack


def replicate(weight, num_phy):
    """Greedy replication: each extra slot to the expert with the largest load per replica."""
    X, n = weight.shape
    phy2log = np.tile(np.arange(num_phy), (X, 1))
    rank = np.zeros((X, num_phy), dtype=np.int64)
    logcnt = np.ones((X, n), dtype=np.int64)
    rows = np.arange(X)
    for i in range(n, num_phy):
        best = np.argmax(weight / logcnt, axis=1)
        phy2log[:, i] = best
        rank[:, i] = logcnt[rows, best]
        logcnt[rows, best] += 1
    return phy2log, rank, logcnt


def _inverse(perm):
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def rebalance_hierarchical(weight, num_phy, num_groups, num_nodes, num_gpus, packing=balanced_packing):
    L, E = weight.shape
    gsize = E // num_groups
    groups_per_node = num_groups // num_nodes
    gpus_per_node = num_gpus // num_nodes
    phy_per_gpu = num_phy // num_gpus
    # 1. groups to nodes
    group_pack, group_rank = packing(weight.reshape(L, num_groups, gsize).sum(-1), num_nodes)
    log2mlog = (((group_pack * groups_per_node + group_rank) * gsize)[:, :, None] + np.arange(gsize)).reshape(L, E)
    mlog2log = _inverse(log2mlog)
    # 2. replicas within nodes
    tokens_per_mlog = np.take_along_axis(weight, mlog2log, 1).reshape(L * num_nodes, E // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate(tokens_per_mlog, num_phy // num_nodes)
    # 3. physical experts to GPUs within nodes
    tokens_per_phy = np.take_along_axis(tokens_per_mlog / mlogcnt, phy2mlog, 1)
    pack_index, rank_in_pack = packing(tokens_per_phy, gpus_per_node)
    phy2pphy = pack_index * phy_per_gpu + rank_in_pack
    pphy2phy = _inverse(phy2pphy)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, 1)
    pphy2mlog = (pphy2mlog.reshape(L, num_nodes, -1) + np.arange(0, E, E // num_nodes)[None, :, None]).reshape(L, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, 1)
    logcnt = np.take_along_axis(mlogcnt.reshape(L, -1), log2mlog, 1)
    return pphy2log, logcnt


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, packing=balanced_packing):
    """phy2log [L, num_replicas] and logcnt [L, E]."""
    weight = np.asarray(weight, dtype=np.float64)
    if num_groups % num_nodes == 0:
        return rebalance_hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus, packing)
    return rebalance_hierarchical(weight, num_replicas, 1, 1, num_gpus, packing)


def balanced_packing_tensor(weight, num_packs):
    """The same packing on torch tensors indexed one element at a time, as the reference does
    (its cost is the per-element tensor indexing, about a second for DeepSeek-V3 geometry)."""
    import torch

    w = torch.as_tensor(weight)
    X, n = w.shape
    per_pack = n // num_packs
    if per_pack == 1:
        return balanced_packing(np.asarray(weight), num_packs)
    order = w.float().sort(-1, descending=True).indices
    pack_index = torch.full((X, n), -1, dtype=torch.int64)
    rank_in_pack = torch.full((X, n), -1, dtype=torch.int64)
    for i in range(X):
        loads = [0] * num_packs
        sizes = [0] * num_packs
        for item in order[i]:
            pack = min((p for p in range(num_packs) if sizes[p] < per_pack), key=loads.__getitem__)
            pack_index[i, item] = pack
            rank_in_pack[i, item] = sizes[pack]
            loads[pack] += w[i, item]
            sizes[pack] += 1
    return pack_index.numpy(), rank_in_pack.numpy()
