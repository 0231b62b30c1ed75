"""GPU-only checks of the bandwidth probes; skipped cleanly without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_uva_view_aliases_pinned_host_memory():
    from hotsplit_probes.hostmem import HostPages

    with HostPages(1 << 20, None, cudart=torch.cuda.cudart()) as buf:
        assert buf.registered, buf.register_error
        host = buf.array()
        host[:4] = 7
        view = buf.device_view(torch, torch.device("cuda", 0))
        assert view.is_cuda and int(view[:4].sum().item()) == 28  # the GPU reads the host bytes in place
        host[:4] = 1
        assert int(view[:4].sum().item()) == 4
        del view
    assert not buf.registered


def test_measure_gpu_small_sweep():
    from hotsplit_probes.bandwidth import SweepPlan, measure_gpu

    plan = SweepPlan((1 << 20, 16 << 20), samples=5, warmup=1, target_bytes=32 << 20)
    bw = measure_gpu(0, (None,), None, plan)
    (node,) = bw.by_node
    for cells in (node.h2d, node.d2h, node.zero_copy_read):
        assert cells is not None and len(cells) == 2
        assert all(m.samples == 5 and m.median_gbps > 0 and m.min_gbps <= m.median_gbps <= m.max_gbps for m in cells)
