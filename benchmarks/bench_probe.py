"""Device check for `hotsplit probe`: its H2D figure against a plain torch pinned copy timed in the
same run (acceptance: within 10%), and its zero-copy read figure against the PCIe link rate
(acceptance: present, and at most the link's theoretical rate).

    python benchmarks/bench_probe.py [--size-mib 256] [--gpu 0]

Exits 0 when both checks pass, 1 when one fails, and 0 with a `skipped` line without CUDA.
`run_check()` returns the rows for a device script that collects several checks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1 << 20


def plain_pinned(size_bytes: int, node: int | None):
    """A plain torch pinned tensor (`pin_memory=True`: cudaHostAlloc) whose pages sit on `node`,
    like the probe's buffer: left alone it lands wherever the calling thread runs, and on a
    two-socket host a remote buffer copies measurably slower, so the comparison would not be like
    for like. The thread's memory policy prefers `node` while the pages are first touched.
    Returns (tensor, NUMA policy document: where its pages were found)."""
    import torch
    from hotsplit_probes import hostmem
    from hotsplit_runtime.pinned import numa_policy_for

    numa = numa_policy_for("preferred", node)
    err = hostmem.set_mempolicy(hostmem.MPOL_PREFERRED, node) if numa.applied else None
    try:
        t = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True).zero_()
    finally:
        if numa.applied and err is None:
            hostmem.set_mempolicy(hostmem.MPOL_DEFAULT, None)
    numa.pages_by_node, numa.located = hostmem.page_nodes(t.data_ptr(), size_bytes)
    if err:
        numa.applied, numa.reason = False, err
    return t, numa.to_doc()


def plain_torch_h2d_gbps(torch, size_bytes: int, gpu: int, samples: int = 10, iters: int = 4,
                         node: int | None = None) -> tuple[float, dict]:
    """Median GB/s of `dst.copy_(torch pinned tensor, non_blocking=True)`, CUDA events, after warm-up,
    the pinned source placed on NUMA node `node` (None: wherever the allocation lands); and how it was
    placed."""
    src, placed = plain_pinned(size_bytes, node)
    dst = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{gpu}")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = []
    with torch.cuda.device(gpu):
        for i in range(samples + 3):
            start.record()
            for _ in range(iters):
                dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            if i >= 3:
                rates.append(size_bytes * iters / (start.elapsed_time(end) / 1e3) / 1e9)
    return statistics.median(rates), placed


def run_check(size_bytes: int = 256 * MIB, gpu: int = 0) -> list[dict] | None:
    """Rows of the check, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    from hotsplit_probes.bandwidth import SweepPlan, measure_gpu
    from hotsplit_probes.common import gpu_of_cuda
    from hotsplit_probes.platform import Sources, measure_platform, take_inventory

    # The probe's own view of the link (NVML) and the GPU's NUMA node.
    inv = take_inventory("quick", None, Sources(gpu_bandwidth=lambda *a, **k: None))
    plat = measure_platform(inv, Sources(gpu_bandwidth=lambda *a, **k: None, host_copy=lambda *a, **k: ()))
    g = gpu_of_cuda(plat.gpus, gpu)
    node = g.numa_node if g else None
    link = g.link_max_rate_gbps if g else None

    plan = SweepPlan((size_bytes,), samples=10, warmup=3, target_bytes=4 * size_bytes)
    # Interleave: plain, probe, plain, so clock or thermal drift hits both sides alike.
    # Both sides read from buffers on the GPU's NUMA node (the probe binds its own buffer there).
    plain_a, placed = plain_torch_h2d_gbps(torch, size_bytes, gpu, node=node)
    bw = measure_gpu(gpu, (node,), node, plan)
    plain_b, _ = plain_torch_h2d_gbps(torch, size_bytes, gpu, node=node)
    plain = (plain_a + plain_b) / 2
    cell = bw.by_node[0]
    h2d = cell.h2d[0].median_gbps if cell.h2d else None
    zc = cell.zero_copy_read[0].median_gbps if cell.zero_copy_read else None
    rows = [
        {"check": "h2d vs plain torch pinned copy", "hotsplit_gbps": h2d, "reference_gbps": plain,
         "node": node, "plain_numa": placed, "probe_numa": cell.placement.__dict__,
         "ratio": None if h2d is None else h2d / plain,
         "ok": h2d is not None and abs(h2d / plain - 1) <= 0.10},
        {"check": "zero-copy read vs link rate", "hotsplit_gbps": zc, "reference_gbps": link,
         "ratio": None if zc is None or not link else zc / link,
         "ok": zc is not None and zc > 0 and (link is None or zc <= link * 1.02)},
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--gpu", type=int, default=0)
    args = ap.parse_args(argv)
    rows = run_check(args.size_mib * MIB, args.gpu)
    if rows is None:
        print("bench_probe: skipped (no CUDA device)")
        return 0

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    print(f"{'check':34} {'hotsplit GB/s':>14} {'reference GB/s':>15} {'ratio':>7}  verdict")
    for r in rows:
        print(f"{r['check']:34} {f(r['hotsplit_gbps']):>14} {f(r['reference_gbps']):>15} {f(r['ratio']):>7}  "
              f"{'ok' if r['ok'] else 'FAIL'}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
