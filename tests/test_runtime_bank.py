"""The hot/cold model equals the all-resident reference: random hot sets, every swap, both routers,
shared experts; the Triton kernels (interpreted on a CPU); CUDA-only paths skip without CUDA."""

import numpy as np
import pytest
import torch

from runtime.device import choose_device
from runtime.engine import ArraySource, Engine
from runtime.moe import MoEGeometry
from runtime.selftest import build_pair, random_hot, random_moves, tolerances

torch.set_num_threads(1)
CPU = choose_device("cpu")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def geom(router, shared=True, **kw):
    g = dict(hidden=32, inter=16, num_experts=8, top_k=2, shared_inter=16 if shared else 0, router=router)
    if router == "sigmoid":
        g.update(n_group=4, topk_group=2, routed_scaling_factor=2.5)
    g.update(kw)
    return MoEGeometry(**g)


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_hot_sets_equal_reference(router, shared, seed):
    rng = np.random.default_rng(seed)
    g = geom(router, shared)
    model, ref = build_pair(g, 3, random_hot(3, 8, rng.random(), rng), CPU, torch.float32, seed)
    x = torch.randn(7, g.hidden, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))


def test_bf16_equal_reference_within_dtype_tolerance():
    g = geom("sigmoid")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, np.random.default_rng(0)), CPU, torch.bfloat16)
    x = torch.randn(4, g.hidden).to(torch.bfloat16)
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.bfloat16))


def test_every_swap_keeps_outputs_equal_and_maps_consistent():
    rng = np.random.default_rng(3)
    g = geom("softmax")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32)
    for _ in range(10):
        model.begin_swaps(random_moves(model, 2, rng))
        for b in model.banks:
            assert np.array_equal(b.expert2slot_E.numpy(), b.table.expert2slot_E)
            for slot, e in enumerate(b.table.slot2expert_S):
                assert torch.equal(b.hot_SB[slot], b.cold_EB[e])
        x = torch.randn(5, g.hidden)
        torch.testing.assert_close(model.step(x), ref.step(x))


def test_outputs_equal_reference_after_every_swap_of_a_dynamic_run():
    from hotsplit_cli.knobs import resolve_knobs
    from hotsplit_cli.traffic import SyntheticTraffic, zipf_shares

    g = geom("sigmoid")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.25, np.random.default_rng(0)), CPU, torch.float32)
    traffic = SyntheticTraffic(zipf_shares(2, 8, 1.2, 1), 2, 6, drift_every=6, seed=1)

    def gen():
        while True:
            yield traffic.next_step(), None

    knobs = resolve_knobs({"dyn_steps": 3, "dyn_max_swaps": 1, "dyn_margin": 1.0}, env={})
    eng = Engine(model, ArraySource("synthetic", 6, gen()), knobs, expert_bytes=1000)
    probe = torch.randn(4, g.hidden)
    checked = []

    def on_record(rec):
        model.publish_ready(wait=True)
        torch.testing.assert_close(model.step(probe), ref.step(probe))
        checked.append(rec.swaps)

    summary = eng.run(30, on_record)
    assert summary.swaps > 0 and sum(checked) == summary.swaps


def test_triton_kernels_equal_reference_in_the_interpreter(monkeypatch):
    import sys

    if "triton" in sys.modules and not sys.modules["triton"].knobs.runtime.interpret:
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when triton is first imported
    pytest.importorskip("triton")
    from runtime.kernels import TritonExperts

    rng = np.random.default_rng(5)
    g = geom("sigmoid", hidden=48, inter=24)
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32,
                            compute=TritonExperts(block_i=16, block_h=32))
    for _ in range(2):
        x = torch.randn(3, g.hidden)
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))
    ids = torch.tensor([[[0, -1], [3, 5], [7, 1]]] * 2)  # padding is ignored
    w = torch.rand(2, 3, 2)
    x = torch.randn(3, g.hidden)
    torch.testing.assert_close(model.step(x, ids, w), ref.step(x, ids, w), **tolerances(torch.float32))


@cuda
def test_cuda_zero_copy_view_reads_pinned_memory_in_place():
    from runtime.bank import zero_copy_view

    host = torch.arange(1024, dtype=torch.float32).pin_memory()
    view = zero_copy_view(host, torch.device("cuda"))
    assert view.is_cuda and view.data_ptr() == host.data_ptr()
    host[3] = -7.0  # a host write is seen by the device: same bytes, no copy
    assert float(view[3]) == -7.0


@cuda
def test_cuda_graph_replay_equals_reference():
    from runtime.selftest import check_graph

    info = choose_device("cuda")
    result = check_graph(info, torch.bfloat16)
    assert result.ok is not False, result.detail


@cuda
def test_cuda_swaps_in_flight_equal_reference():
    from runtime.selftest import check_reference, check_swaps

    info = choose_device("cuda")
    for check in (check_reference(info, torch.bfloat16), check_swaps(info, torch.bfloat16)):
        assert check.ok, check.detail
