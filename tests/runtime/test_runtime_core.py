"""Runtime building blocks: routers, grouped experts, slot table, pinned slabs, NUMA policy."""

import numpy as np
import pytest
import torch
from hotsplit_runtime.bank import SlotTable
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.moe import MoEGeometry, expert_counts, grouped_experts, make_layer_weights
from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for, round_up_pow2

from tests.runtime.reference import dense_reference

torch.set_num_threads(1)


def geom(router="softmax", **kw):
    base = dict(hidden=32, inter=16, num_experts=8, top_k=2, shared_inter=16, router=router)
    if router == "sigmoid":
        base.update(n_group=4, topk_group=2, routed_scaling_factor=2.5)
    base.update(kw)
    return MoEGeometry(**base)


def test_softmax_router_matches_manual_topk():
    g = geom("softmax", norm_topk_prob=False)
    lw = make_layer_weights(g, 0, torch.float32)
    x = torch.randn(5, g.hidden)
    ids, w = lw.router(x)
    probs = torch.softmax(x @ lw.router.weight_EH.T, dim=-1)
    want_w, want_ids = probs.topk(2, dim=-1)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w)


def test_sigmoid_router_is_group_limited_and_uses_unbiased_scores():
    g = geom("sigmoid")
    lw = make_layer_weights(g, 1, torch.float32)
    lw.router.bias_E = torch.zeros(8)
    lw.router.bias_E[7] = 10.0  # the bias drives selection only
    x = torch.randn(64, g.hidden)
    ids, w = lw.router(x)
    assert (ids == 7).any(dim=1).all()
    scores = torch.sigmoid(x @ lw.router.weight_EH.T)
    picked = scores.gather(1, ids)
    torch.testing.assert_close(w, picked / picked.sum(1, keepdim=True) * 2.5)
    groups = ids // 2  # 4 groups of 2 experts, only 2 groups may be used per token
    assert all(len(set(row.tolist())) <= 2 for row in groups)


def test_grouped_experts_equal_dense_reference_with_padding():
    g = geom()
    lw = make_layer_weights(g, 2, torch.float32)
    x = torch.randn(6, g.hidden)
    ids = torch.randint(0, 8, (6, 2))
    ids[0, 1] = -1  # padding slot
    w = torch.rand(6, 2)
    counts = expert_counts(ids, 8)
    assert int(counts.sum()) == 11
    got = grouped_experts(x, ids, w, lambda e: (lw.w13_EIH[e], lw.w2_EHI[e]), 8)
    torch.testing.assert_close(got, dense_reference(x, ids, w, lw.w13_EIH, lw.w2_EHI))


def test_slot_table_maps_stay_inverse_and_refuse_bad_swaps():
    t = SlotTable(np.array([True, False, True, False]))
    assert t.slot2expert_S.tolist() == [0, 2] and t.expert2slot_E.tolist() == [0, -1, 1, -1]
    assert t.swap(2, 3) == 1
    assert t.hot_E.tolist() == [True, False, False, True]
    for s, e in enumerate(t.slot2expert_S):
        assert t.expert2slot_E[e] == s
    with pytest.raises(ValueError):
        t.swap(1, 2)  # 1 is cold
    with pytest.raises(ValueError):
        t.swap(0, 3)  # 3 is already hot


@pytest.mark.parametrize("n,want", [(0, 1), (1, 1), (3, 4), (4096, 4096), (4097, 8192)])
def test_round_up_pow2(n, want):
    assert round_up_pow2(n) == want


def test_pageable_slabs_are_whole_pages(monkeypatch):
    from hotsplit_probes import hostmem

    located = []
    page_nodes = hostmem.page_nodes
    monkeypatch.setattr(hostmem, "page_nodes", lambda *a, **k: located.append(a) or page_nodes(*a, **k))
    a = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
    slab = a.alloc(3000)
    assert slab.numel() == 4096 and a.requested_bytes == 3000 and a.reserved_bytes == 4096 and a.method == "pageable"
    assert len(located) == 1  # each slab's pages are located once (by its HostPages), not again here
    assert a.numa.pages_by_node == a.slabs[0].location.pages_by_node
    assert int(slab.sum()) == 0
    with pytest.raises(ValueError, match="not mapped for a device"):
        a.device_address(slab[10:])


class FakeCudart:
    def __init__(self, rc: int = 0):
        self.rc, self.registered, self.unregistered = rc, [], []

    def cudaHostRegister(self, address, size, flags):  # noqa: N802 - CUDA's name
        self.registered.append((address, size, flags))
        return self.rc

    def cudaHostUnregister(self, address):  # noqa: N802
        self.unregistered.append(address)
        return 0


def test_pinned_slabs_are_registered_at_their_own_size(monkeypatch):
    """On a GPU: an exact-size mapping registered Portable|Mapped, not a power of two."""
    from hotsplit_probes import hostmem

    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(hostmem, "device_pointer", lambda host: host + (1 << 40))  # a non-UVA mapping
    a = PinnedAllocator(pin=True, numa=numa_policy_for("off", None))
    slab = a.alloc(3 * 4096 + 1)
    assert slab.numel() == 4 * 4096 and a.reserved_bytes == 4 * 4096 and a.method == "cudaHostRegister"
    address = slab.data_ptr()
    assert cudart.registered == [(address, 4 * 4096, 3)]
    assert a.device_address(slab[100:]) == address + 100 + (1 << 40)
    assert int(slab.sum()) == 0 and sum(a.numa.pages_by_node.values()) == 4
    assert cudart.unregistered == []  # the slab is still in use
    del slab  # the allocator does not keep it: the last tensor goes, the slab goes
    assert cudart.unregistered == [address] and not any(s.alive for s in a.slabs)
    with pytest.raises(ValueError, match="not in a slab"):
        a.device_address(torch.empty(1))


def test_a_failed_registration_falls_back_to_torch_pinned_and_says_why(monkeypatch):
    from hotsplit_probes import hostmem
    from hotsplit_runtime import pinned

    cudart = FakeCudart(rc=2)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(hostmem, "clear_cuda_error", lambda: None)
    monkeypatch.setattr(pinned, "_torch_pinned", lambda size: torch.zeros(size, dtype=torch.uint8))
    a = PinnedAllocator(pin=True, numa=numa_policy_for("off", None))
    slab = a.alloc(3000)
    assert slab.numel() == 4096 and a.method == "torch pinned" and "cudaError 2" in a.fallback
    assert a.slabs[-1].location.share_by_node or a.slabs[-1].location.why_not_located  # located once, here
    a.alloc(5000)  # no second attempt once registration failed
    assert len(cudart.registered) == 1 and a.reserved_bytes == 4096 + 8192
    assert cudart.unregistered == []  # a failed registration is never undone


def test_numa_policy_records_why_it_is_not_applied():
    assert numa_policy_for("off", 0).reason == "numa_policy is off"
    p = numa_policy_for("bind", None, "no GPU")
    assert not p.applied and p.reason == "no GPU"
    p = numa_policy_for("preferred", 999)
    assert not p.applied and p.reason


def _sysfs_nodes():
    import os

    try:
        return sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit())
    except OSError:
        return []


def test_allocator_locates_the_pages_of_every_slab():
    a = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
    a.alloc(1 << 20)
    a.alloc(1 << 16)
    p = a.numa
    if p.located:  # no move_pages here (another architecture, or a sandbox refusing it)
        assert not p.pages_by_node and "pages not located" in p.describe()
        return
    # 256 sampled pages of the 1 MiB slab, every page the 64 KiB one spans (16 or 17 of 4 KiB)
    assert 256 + 16 <= sum(p.pages_by_node.values()) <= 256 + 17
    assert set(p.pages_by_node) <= set(_sysfs_nodes() or [0])
    doc = p.to_doc()
    assert sum(doc["share_by_node"].values()) == pytest.approx(1.0) and doc["verified"] is None
    assert p.describe().startswith("numa_policy off; pages 100% on node") or len(p.pages_by_node) > 1


def test_numa_verdict_compares_located_pages_with_the_target():
    from hotsplit_runtime.pinned import NumaPolicy

    p = NumaPolicy("bind", 1, True, None, pages_by_node={1: 255, 0: 1})
    assert p.verified is True
    assert p.describe() == "numa_policy bind node 1: applied; pages 0% on node 0, 100% on node 1 (verified)"
    p = NumaPolicy("preferred", 1, True, None, pages_by_node={0: 200, 1: 56})
    assert p.verified is False and p.describe().endswith("(NOT on the target node)")
    p = NumaPolicy("preferred", 0, False, "one NUMA node: every page is already local", pages_by_node={0: 8})
    assert p.verified is None and "not applied (one NUMA node" in p.describe()


def test_cpu_device_records_reasons():
    info = choose_device("cpu")
    assert not info.is_cuda and not info.zero_copy and "zero_copy" in info.reasons


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_usage_error():
    from hotsplit_cli.core.errors import UsageError

    with pytest.raises(UsageError):
        choose_device("cuda")
