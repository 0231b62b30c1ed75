"""Measured bandwidth: host memory copies (always) and, where CUDA exists, pinned host<->GPU copies
and GPU zero-copy reads of pinned host memory, per host NUMA node and buffer size.

GB/s means 1e9 bytes per second. Each figure is the median of `samples` timed samples taken
after `warmup` untimed ones; a sample times `iterations` back-to-back operations of one size,
so small sizes include the per-operation overhead that collapses their bandwidth in practice.

Zero-copy read: the host buffer (`hostmem.HostPages`: placed on one NUMA node and registered
with `cudaHostRegister(Portable | Mapped)`, the cold bank's own kind of memory) is wrapped at its
device address as a CUDA tensor through `__cuda_array_interface__`.
A `sum` over that tensor is an SM kernel whose loads travel over PCIe: no copy engine, no
staging buffer, exactly how the runtime's cold experts are read. torch is imported lazily.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .common import Reason, median
from .hostmem import HostPages, PageLocation
from .nvml import LinkState
from .timing import cuda_event_clock, wall_clock

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
Tick = Callable[[int], None]


@dataclass(frozen=True)
class Measurement:
    """One (operation, size) cell: median and spread of the samples, GB/s (1e9 B/s)."""

    size_bytes: int
    iterations: int  # operations per sample
    samples: int
    median_gbps: float
    min_gbps: float
    max_gbps: float
    spread_gbps: float  # max - min
    pct_of_link: float | None = None  # median / link rate (GPU operations with a known link)


def summarize(size_bytes: int, iterations: int, gbps: Sequence[float]) -> Measurement:
    """Median, min, max and spread of per-sample rates."""
    if not gbps:
        raise ValueError("no samples")
    lo, hi = min(gbps), max(gbps)
    return Measurement(size_bytes, iterations, len(gbps), median(gbps), lo, hi, hi - lo)


def with_link(m: Measurement, link_gbps: float | None) -> Measurement:
    pct = None if not link_gbps else m.median_gbps / link_gbps
    return Measurement(m.size_bytes, m.iterations, m.samples, m.median_gbps, m.min_gbps, m.max_gbps,
                       m.spread_gbps, pct)


@dataclass(frozen=True)
class SweepPlan:
    """Which sizes to time, and how often."""

    sizes_bytes: tuple[int, ...]
    samples: int = 5
    warmup: int = 2
    target_bytes: int = 256 * MIB  # bytes moved per sample: small sizes repeat to reach it
    max_iterations: int = 512

    def iterations(self, size_bytes: int) -> int:
        return max(1, min(self.max_iterations, math.ceil(self.target_bytes / size_bytes)))

    def limited_to(self, max_bytes: int) -> SweepPlan:
        return SweepPlan(tuple(s for s in self.sizes_bytes if s <= max_bytes), self.samples, self.warmup,
                         self.target_bytes, self.max_iterations)


def _sizes(lo: int, hi: int, factor: int) -> tuple[int, ...]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return tuple(out)


def sweep_plan(mode: str, target: str, extra_sizes: Sequence[int] = ()) -> SweepPlan:
    """The sweep for `mode` quick|full on `target` gpu|host, plus extra sizes (one real expert).

    quick keeps `hotsplit probe` to seconds; full sweeps 64 KiB..1 GiB by powers of 4 with
    10 samples each.
    """
    if mode not in ("quick", "full"):
        raise ValueError(f"mode must be quick or full, got {mode!r}")
    if target == "gpu":
        base = (64 * KIB, 2 * MIB, 64 * MIB, 256 * MIB) if mode == "quick" else _sizes(64 * KIB, GIB, 4)
        target_bytes = 256 * MIB if mode == "quick" else GIB
    elif target == "host":
        base = (64 * KIB, 4 * MIB, 64 * MIB) if mode == "quick" else _sizes(64 * KIB, GIB, 4)
        target_bytes = 64 * MIB if mode == "quick" else 256 * MIB
    else:
        raise ValueError(f"target must be gpu or host, got {target!r}")
    # Sizes stay multiples of 4 bytes: the zero-copy kernel reads float32 words.
    sizes = sorted(set(base) | {s - s % 4 for s in extra_sizes if s >= 4})
    samples, warmup = (5, 2) if mode == "quick" else (10, 3)
    return SweepPlan(tuple(sizes), samples, warmup, target_bytes)


def time_samples(op: Callable[[], Any], iterations: int, plan: SweepPlan,
                 elapsed_s: Callable[[Callable[[], None]], float]) -> list[float]:
    """Seconds per sample of `iterations` calls of `op`, after `plan.warmup` untimed samples."""

    def run() -> None:
        for _ in range(iterations):
            op()

    for _ in range(plan.warmup):
        elapsed_s(run)
    return [elapsed_s(run) for _ in range(plan.samples)]


def rates_gbps(size_bytes: int, iterations: int, seconds: Sequence[float]) -> list[float]:
    return [size_bytes * iterations / max(s, 1e-12) / 1e9 for s in seconds]


# ----------------------------------------------------------------------------- host copies


@dataclass(frozen=True)
class HostCopyNode:
    """memcpy bandwidth from a buffer on `node` into a buffer local to the measuring thread."""

    node: int | None
    placement: PageLocation
    copy: tuple[Measurement, ...]


def measure_host_copy(nodes: Sequence[int | None], plan: SweepPlan,
                      tick: Tick | None = None) -> tuple[HostCopyNode, ...]:
    """Host memory copy bandwidth (what a CPU runtime reads its experts at), per source node."""
    tick = tick or (lambda n: None)
    top = max(plan.sizes_bytes)
    out = []
    dst = HostPages(top, fill=1).array()
    for node in nodes:
        src_pages = HostPages(top, node, fill=1)
        src = src_pages.array()
        cells = []
        for size in plan.sizes_bytes:
            a, b = dst[:size], src[:size]
            iters = plan.iterations(size)
            seconds = time_samples(lambda a=a, b=b: np.copyto(a, b), iters, plan, wall_clock)
            cells.append(summarize(size, iters, rates_gbps(size, iters, seconds)))
            tick(1)
        out.append(HostCopyNode(node, src_pages.location, tuple(cells)))
        del a, b, src, src_pages  # this node's buffer is unmapped before the next one is made
    return tuple(out)


# ----------------------------------------------------------------------------- GPU


@dataclass(frozen=True)
class NodeBandwidth:
    """Host buffer on one NUMA node, read and written by one GPU."""

    node: int | None
    local: bool | None  # the GPU's own node (None: the GPU's node is unknown)
    placement: PageLocation
    h2d: tuple[Measurement, ...] | None  # copy engine, pinned host -> device
    d2h: tuple[Measurement, ...] | None  # copy engine, device -> pinned host
    zero_copy_read: tuple[Measurement, ...] | None  # SM loads from pinned host memory (UVA)
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class GpuBandwidth:
    cuda_index: int
    method: str
    by_node: tuple[NodeBandwidth, ...]
    link_gen_under_load: int | None  # idle links train down: sampled while copies run
    link_width_under_load: int | None
    reasons: tuple[Reason, ...] = ()
    roundtrip_ms: float | None = None  # a step's activations to the host and back (the GPU side of a CPU cold path)


ZERO_COPY_METHOD = ("zero-copy read: torch sum() over a CUDA tensor aliasing pinned host memory "
                    "(cudaHostRegister Portable|Mapped, UVA device pointer); copies: torch copy_(non_blocking) "
                    "from/to the same registered buffer; timed with CUDA events")

LINK_LOAD_SECONDS = 0.4  # host->device copying queued while the link state is sampled
LINK_SAMPLES = 3
LINK_SAMPLE_GAP_S = 0.05  # the samples span 0.05..0.15 s, well inside the queued copying


def link_load_copies(size_bytes: int, h2d_gbps: float | None) -> int:
    """Copies of `size_bytes` that keep the link busy for LINK_LOAD_SECONDS at the measured H2D
    rate (at least 4 GiB when the rate is unknown): a fixed 4 GiB lasts only ~75 ms on a PCIe
    Gen5 x16 link, so the last samples could land after the copies had drained."""
    load_bytes = 4 * GIB if not h2d_gbps else max(4 * GIB, LINK_LOAD_SECONDS * h2d_gbps * 1e9)
    return max(1, math.ceil(load_bytes / size_bytes))


def _sample_link_under_load(torch: Any, dst: Any, src: Any, sample_link: Callable[[], LinkState],
                            h2d_gbps: float | None = None) -> LinkState:
    """Queue host->device copies for ~LINK_LOAD_SECONDS, then read the link state while they run
    (the highest generation and width seen; the last reason when a field was never read)."""
    for _ in range(link_load_copies(dst.numel(), h2d_gbps)):
        dst.copy_(src, non_blocking=True)
    time.sleep(LINK_SAMPLE_GAP_S)  # let the link retrain up from its idle state
    gens, widths, why = [], [], None
    for _ in range(LINK_SAMPLES):
        s = sample_link()
        gens += [s.gen] if s.gen else []
        widths += [s.width] if s.width else []
        why = s.reason or why
        time.sleep(LINK_SAMPLE_GAP_S)
    torch.cuda.synchronize()
    return LinkState(max(gens) if gens else None, max(widths) if widths else None,
                     None if gens and widths else why)


def measure_gpu(cuda_index: int, nodes: Sequence[int | None], local_node: int | None, plan: SweepPlan,
                sample_link: Callable[[], LinkState] | None = None,
                tick: Tick | None = None) -> GpuBandwidth:
    """H2D, D2H and zero-copy read bandwidth of one GPU against a host buffer on each node."""
    import torch

    tick = tick or (lambda n: None)
    device = torch.device("cuda", cuda_index)
    reasons: list[Reason] = []
    free_bytes, _ = torch.cuda.mem_get_info(device)
    fitting = plan.limited_to(free_bytes // 2)
    if len(fitting.sizes_bytes) < len(plan.sizes_bytes):
        reasons.append(Reason("by_node", f"sizes above {free_bytes // 2 // MIB} MiB skipped: half the free GPU "
                                         "memory"))
    if not fitting.sizes_bytes:
        return GpuBandwidth(cuda_index, ZERO_COPY_METHOD, (), None, None, tuple(reasons))
    top = max(fitting.sizes_bytes)
    cudart = torch.cuda.cudart()
    clock = cuda_event_clock(torch)
    by_node = []
    link: LinkState | None = None
    with torch.cuda.device(device):
        dst = torch.empty(top, dtype=torch.uint8, device=device)
        for node in nodes:
            buf = HostPages(top, node, cudart=cudart, fill=1)
            local = None if local_node is None or node is None else node == local_node
            if not buf.registered:
                why = buf.register_error or "not registered"
                by_node.append(NodeBandwidth(node, local, buf.location, None, None, None,
                                             tuple(Reason(k, why) for k in ("h2d", "d2h", "zero_copy_read"))))
                tick(3 * len(fitting.sizes_bytes))
                continue
            with buf:  # unregistered on the way out, once the device is idle
                cell = _measure_node(torch, dst, buf, node, local, fitting, clock, tick)
                by_node.append(cell)
                unread = link is None or (link.gen is None and link.width is None)
                if sample_link is not None and unread and local in (True, None):
                    rate = cell.h2d[-1].median_gbps if cell.h2d else None
                    link = _sample_link_under_load(torch, dst, buf.tensor(), sample_link, rate)
        roundtrip = measure_roundtrip_ms(torch, device)
        del dst
    if sample_link is None:
        reasons.append(Reason("link_gen_under_load", "no NVML to read the link state"))
    elif link is None or link.gen is None or link.width is None:
        why = link.reason if link is not None and link.reason else "no copy ran from the GPU's own node"
        reasons.append(Reason("link_gen_under_load", f"the link state could not be read while copying ({why})"))
    link = link or LinkState(None, None)
    return GpuBandwidth(cuda_index, ZERO_COPY_METHOD, tuple(by_node), link.gen, link.width, tuple(reasons), roundtrip)


ROUNDTRIP_BYTES = 16 * 7168 * 2  # 16 tokens of DeepSeek-V3 activations in bf16


def measure_roundtrip_ms(torch: Any, device: Any, n_bytes: int = ROUNDTRIP_BYTES, samples: int = 50) -> float:
    """Median ms for a device buffer to reach pinned host memory, be seen by the host, and go back:
    what a CPU cold path pays per layer besides its compute (routing and activations down, the
    CPU's outputs up)."""
    dev = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    done = torch.cuda.Event()
    times = []
    for i in range(samples + 5):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        host.copy_(dev, non_blocking=True)
        done.record()
        done.synchronize()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    return median(times)


def _measure_node(torch: Any, dst: Any, buf: HostPages, node: int | None, local: bool | None, plan: SweepPlan,
                  clock: Callable[[Callable[[], None]], float], tick: Tick) -> NodeBandwidth:
    host = buf.tensor()  # CPU tensor on the registered (pinned) pages
    reasons: list[Reason] = []
    try:
        view = buf.device_view(torch, dst.device).view(torch.float32)
    except (RuntimeError, TypeError, ValueError) as exc:
        view = None
        reasons.append(Reason("zero_copy_read", f"no UVA view of pinned memory: {exc}"))
    h2d, d2h, zc = [], [], []
    for size in plan.sizes_bytes:
        iters = plan.iterations(size)
        d, h = dst[:size], host[:size]
        s = time_samples(lambda d=d, h=h: d.copy_(h, non_blocking=True), iters, plan, clock)
        h2d.append(summarize(size, iters, rates_gbps(size, iters, s)))
        s = time_samples(lambda d=d, h=h: h.copy_(d, non_blocking=True), iters, plan, clock)
        d2h.append(summarize(size, iters, rates_gbps(size, iters, s)))
        if view is not None:
            v = view[: size // 4]
            s = time_samples(lambda v=v: v.sum(), iters, plan, clock)
            zc.append(summarize(size, iters, rates_gbps(size, iters, s)))
        tick(3)
    return NodeBandwidth(node, local, buf.location, tuple(h2d), tuple(d2h), tuple(zc) if view is not None else None,
                         tuple(reasons))
