"""How fast this host's CPU computes routed experts read from host memory: the rate of the CPU cold
path, in GB/s of expert weights streamed (1e9 B/s).

An expert is SwiGLU: gate and up [2I, H], then down [H, I], computed with torch on the CPU in the
cold bank's dtype for 1, 2, 4, 8 and 16 tokens by the function the runtime's CPU cold path calls
(`stacked_experts` below, which runtime/moe.py re-exports), on a pool laid out as the cold bank
is: its tokens gathered from the batch, one grouped matmul per projection (expert by expert where
few of a stack's experts are used: `by_expert`), the weighted result added into a float32
output, so that the work around the matmuls is timed too. What one call of it costs beyond its
experts (its output, grouping the routing by expert) is measured apart: `layer_ms`, the fixed
cost of each layer a CPU computes.
A cold expert's weights are not in any cache, so the probe computes a pool of distinct experts,
together many times the last-level cache, one after another: each is streamed from DRAM, as a
cold expert would be. The pool sits on the GPU's NUMA node (where the cold bank is
pinned) and the threads are that node's CPUs (sched_setaffinity and torch's intra-op threads),
restored afterwards; without a GPU, one thread in float32, as the CPU runtime computes. A sample
times one pass over the pool; the figure is the median of `samples` samples after one warm-up.

torch is imported lazily. Whatever cannot be done (no torch, no CPU list for the node) is a
reason, and the measurement falls back to what it can do, saying so.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .bandwidth import MIB, Measurement, summarize
from .common import Reason
from .hostmem import HostPages
from .timing import median_ms, wall_clock

# Two tokens is measured because one token is a different kernel: x @ w.T for one row is a
# matrix-vector product, from two rows on a matrix-matrix one, and the step between them is no
# line: on this project's 2-core VM (`hotsplit probe --recipe mixtral-8x7b --scale 0.0625`, three
# runs) 2 tokens cost 1.25-1.55x one and as much as 4, so a line from 1 to 4 predicted 2-token
# experts 15-30% too fast; at decode batch sizes they are many of the experts a step reads
# (docs/benchmarks.md, "Predicted vs achieved per path").
TOKENS = (1, 2, 4, 8, 16)
POOL_BYTES = 512 * MIB  # 16x a 32 MiB last-level cache: every expert streams from DRAM
QUICK_POOL_BYTES = 256 * MIB
METHOD = ("torch on the CPU: x @ w13.T, silu(gate) * up, @ w2.T for each expert of a pool of distinct experts "
          "(several times the last-level cache) on the GPU's NUMA node, threads of that node, by the runtime's "
          "CPU cold path compute (stacked_experts: one grouped mm per projection, expert by expert where few "
          "of a stack's experts are used); one pass per sample, "
          "wall clock; GB/s = expert weight bytes / time; layer_ms = "
          "(the pool as one call per expert - as one call) / experts, median over paired samples")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# How the runtime computes experts on a machine without CUDA (runtime/from_recipe.py picks float32,
# runtime/device.py tune_cpu_threads one intra-op thread): what the probe measures there.
CPU_RUNTIME_DTYPE = "float32"
CPU_RUNTIME_THREADS = 1


@dataclass(frozen=True)
class ExpertShape:
    """One routed expert as the cold bank holds it (one rank's slice under TP)."""

    hidden: int
    inter: int
    dtype: str  # float32 | bfloat16 | float16

    @property
    def expert_bytes(self) -> int:
        return 3 * self.hidden * self.inter * DTYPE_BYTES[self.dtype]


# DeepSeek-V3's routed expert (hidden 7168, moe_intermediate_size 2048, bf16 compute: deepseek-ai/DeepSeek-V3
# config.json): the shape measured when no recipe says otherwise.
DEFAULT_SHAPE = ExpertShape(7168, 2048, "bfloat16")
DEFAULT_LAYER_EXPERTS = 256  # ... and its n_routed_experts


@dataclass(frozen=True)
class CpuExpertRate:
    """The CPU expert rate of one NUMA node's threads, per token count."""

    node: int | None  # where the pool's pages and the threads were (None: unbound)
    cpus: tuple[int, ...] | None  # the threads' CPUs (None: left as the process had them)
    threads: int
    shape: ExpertShape
    expert_bytes: int  # weight bytes one expert streams
    pool_experts: int
    by_tokens: tuple[tuple[int, Measurement], ...]  # (tokens per expert, GB/s of weights streamed)
    handoff_ms: float | None = None  # median round trip of a task to a worker thread and back
    layer_ms: float | None = None  # one layer's call of the grouped compute, beyond its experts
    layer_experts: int | None = None  # routed experts per layer in that call (its grouping's size)
    method: str = METHOD
    reasons: tuple[Reason, ...] = ()

    def gbps(self, tokens: float) -> float | None:
        """The median rate for `tokens` tokens per expert (see `interpolate_gbps`)."""
        return interpolate_gbps([(t, m.median_gbps) for t, m in self.by_tokens], tokens)


def interpolate_gbps(points: Sequence[tuple[float, float]], tokens: float) -> float | None:
    """A rate at `tokens` tokens per expert from measured (tokens, GB/s) points: linear between
    them, flat beyond them; None without points."""
    pts = sorted(points)
    if not pts:
        return None
    if tokens <= pts[0][0]:
        return pts[0][1]
    for (t0, g0), (t1, g1) in zip(pts, pts[1:], strict=False):
        if tokens <= t1:
            return g0 + (g1 - g0) * (tokens - t0) / (t1 - t0)
    return pts[-1][1]


def pool_size(shape: ExpertShape, pool_bytes: int) -> int:
    """Distinct experts in the pool: enough to fill `pool_bytes`, at least 2."""
    return max(2, pool_bytes // shape.expert_bytes)


def swiglu_expert(torch: Any, x_TH: Any, w13_IH: Any, w2_HI: Any) -> Any:
    """One expert's output [T, H]: w2 @ (silu(gate) * up), gate and up the halves of w13 @ x."""
    h = torch.nn.functional.linear(x_TH, w13_IH)
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w2_HI)


def expert_groups(ids_TK: Any, num_experts: int) -> Iterator[tuple[int, Any, Any]]:
    """Routed assignments grouped by expert: yields (e, tok [n], idx [n]) for every expert with
    n > 0 assignments, `idx` indexing the flattened [T*K] assignments and `tok` their tokens.
    Ids outside [0, E) (padding is -1) belong to no group. Reads the counts on the host."""
    import torch

    K = ids_TK.shape[1]
    flat = ids_TK.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    counts_E = torch.bincount(flat[valid], minlength=num_experts).tolist()
    order = torch.argsort(torch.where(valid, flat, num_experts), stable=True)  # invalid ids sort last
    start = 0
    for e, n in enumerate(counts_E):
        if n:
            idx = order[start:start + n]
            start += n
            yield e, idx // K, idx


def grouped_experts(x_TH: Any, ids_TK: Any, w_TK: Any, weights_of: Callable[[int], tuple[Any, Any]],
                    num_experts: int) -> Any:
    """Routed expert output [T, H]: tokens grouped by expert, each expert's weights fetched once
    through `weights_of(e) -> (w13 [2I, H], w2 [H, I])`, accumulated in float32. How the runtime
    computes experts with torch (runtime/moe.py re-exports it), and what the probe times."""
    import torch

    out_TH = torch.zeros(ids_TK.shape[0], x_TH.shape[1], dtype=torch.float32, device=x_TH.device)
    w_flat = w_TK.reshape(-1)
    for e, tok, idx in expert_groups(ids_TK, num_experts):
        w13, w2 = weights_of(e)
        y = swiglu_expert(torch, x_TH[tok], w13, w2)
        out_TH.index_add_(0, tok, y.float() * w_flat[idx, None])
    return out_TH.to(x_TH.dtype)


# A cache: (device type, dtype) -> whether torch._grouped_mm runs there, tried once per process.
_GROUPED_MM: dict[tuple[str, Any], bool] = {}


def has_grouped_mm(torch: Any, device_type: str, dtype: Any) -> bool:
    """Whether this torch's `_grouped_mm` computes on `device_type` in `dtype` (tried once on a
    tiny case, then remembered)."""
    key = (device_type, dtype)
    if key not in _GROUPED_MM:
        try:
            a, b = torch.ones(2, 16, dtype=dtype, device=device_type), torch.ones(1, 16, 16, dtype=dtype,
                                                                                 device=device_type)
            torch._grouped_mm(a, b, offs=torch.tensor([2], dtype=torch.int32, device=device_type))
            _GROUPED_MM[key] = True
        except (AttributeError, RuntimeError, NotImplementedError):
            _GROUPED_MM[key] = False
    return _GROUPED_MM[key]


# A grouped mm on a CPU calls mm once per expert of the stack, used or not: an empty group cost
# 2-5 us per projection on this project's 2-core VM (128 experts with 8 used: 0.3-0.8 ms a call,
# against 0.05 ms for 8 groups alone), a used expert's own F.linear pair 15-20 us. Measured over
# overhead-sized experts (2 threads, the minimum of 31 samples under load): expert by expert was
# faster wherever at most 1 in 8 of the stack was used (64 experts: 4, 8; 128: 8, 16), mixed at
# 1 in 5 to 1 in 4, slower from 1 in 3. So at most 1 in GROUPS_PER_EXPERT_LOOP used goes expert
# by expert (Qwen3-30B-A3B at batch 1: 8 of 128; DeepSeek-V2-Lite: 6 of 64), a fuller stack grouped.
GROUPS_PER_EXPERT_LOOP = 8


def by_expert(used: int, stacked: int) -> bool:
    """Whether `stacked_experts` computes `used` distinct experts of a stack of `stacked` one
    F.linear pair at a time rather than in one grouped mm per projection."""
    return used * GROUPS_PER_EXPERT_LOOP <= stacked


def stacked_experts(x_TH: Any, ids_TK: Any, w_TK: Any, w13_EIH: Any, w2_EHI: Any) -> Any:
    """Routed expert output [T, H] over experts stacked `w13 [E, 2I, H]`, `w2 [E, H, I]` (views
    into one bank: each expert contiguous, any stride between experts): the assignments with an id
    in [0, E) (padding is -1) sorted by expert, gate/up in one `torch._grouped_mm`, silu(gate) * up
    over them all, down in a second, each row times its routing weight, added per token in
    float32. Per expert the same matmuls as `grouped_experts` (torch's CPU grouped mm calls mm on
    each group), without a copy of any weight. Where few of the stack's experts are used
    (`by_expert`) the same rows expert by expert over the same views instead, since the grouped
    mm's empty groups would cost more than a Python step per used expert. How the runtime's CPU
    cold path computes a native bank (runtime/cold_split.py), and what the probe times. Reads the
    routing on the host. Where this torch has no grouped mm for the weights' device and dtype
    (torch < 2.9 on a CPU), expert by expert through `grouped_experts`, on the same views."""
    import torch

    T, K = ids_TK.shape
    E = w13_EIH.shape[0]
    if not has_grouped_mm(torch, w13_EIH.device.type, w13_EIH.dtype):
        return grouped_experts(x_TH, ids_TK, w_TK, lambda e: (w13_EIH[e], w2_EHI[e]), E)
    flat = ids_TK.reshape(-1)
    idx = torch.nonzero((flat >= 0) & (flat < E)).squeeze(1)  # grouped mm reads every row it is given
    order = torch.argsort(flat[idx], stable=True)
    idx = idx[order]
    counts_E = torch.bincount(flat[idx], minlength=E)
    tok = idx // K
    used = [(e, n) for e, n in enumerate(counts_E.tolist()) if n]
    if by_expert(len(used), E):
        y = _expert_by_expert(torch, x_TH[tok], used, w13_EIH, w2_EHI)
    else:
        offs_E = torch.cumsum(counts_E, 0, dtype=torch.int32)
        h = torch._grouped_mm(x_TH[tok], w13_EIH.transpose(-2, -1), offs=offs_E)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(torch.nn.functional.silu(gate) * up, w2_EHI.transpose(-2, -1), offs=offs_E)
    out_TH = torch.zeros(T, x_TH.shape[1], dtype=torch.float32, device=x_TH.device)
    out_TH.index_add_(0, tok, y.float() * w_TK.reshape(-1)[idx, None])
    return out_TH.to(x_TH.dtype)


def _expert_by_expert(torch: Any, x_AH: Any, used: list[tuple[int, int]], w13_EIH: Any, w2_EHI: Any) -> Any:
    """[A, H]: the rows `x_AH` (sorted by expert, `used` its (expert, rows) runs) through their
    experts, one `swiglu_expert` per used expert on its contiguous views of the stack."""
    ys, start = [], 0
    for e, n in used:
        ys.append(swiglu_expert(torch, x_AH[start:start + n], w13_EIH[e], w2_EHI[e]))
        start += n
    return torch.cat(ys) if ys else x_AH.new_zeros(0, w2_EHI.shape[1])


def on_cpus(torch: Any, cpus: Sequence[int] | None, work: Callable[[], Any], threads: int | None = None
            ) -> tuple[Any, int]:
    """Run `work` in a fresh thread pinned to `cpus`, with `threads` (default: as many as `cpus`)
    torch intra-op threads, and return (its result, the thread count). Pinning the calling thread
    would not do: torch's thread team, made at its first parallel op, keeps the CPUs it had; a
    fresh thread's team takes its CPUs. Without `cpus`, in the calling thread: where the runtime
    pins nothing (no GPU, so no GPU's node) its CPU cold path computes in the thread that calls it
    (runtime/cold_split.py), and the rate is that thread team's."""
    from concurrent.futures import ThreadPoolExecutor

    saved = torch.get_num_threads()
    n = threads or (len(cpus) if cpus else len(os.sched_getaffinity(0)))
    if not cpus:
        torch.set_num_threads(n)
        try:
            return work(), n
        finally:
            torch.set_num_threads(saved)

    def start() -> None:  # in the fresh thread: OpenMP's thread count is per thread
        if cpus:
            os.sched_setaffinity(0, tuple(cpus))
        torch.set_num_threads(n)

    try:
        with ThreadPoolExecutor(1, initializer=start) as pool:
            return pool.submit(work).result(), n
    finally:
        torch.set_num_threads(saved)


def measure_handoff_ms(samples: int = 200) -> float:
    """Median ms to hand a task to a worker thread and get its result back: the CPU side of the
    per-layer synchronisation a CPU cold path pays (the GPU side is the probe's round trip)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # the thread starts here, not in a sample
        return median_ms(lambda: pool.submit(int).result(), samples)


def _time_pool(torch, shape: ExpertShape, w13, w2, tokens: Sequence[int], samples: int, layer_experts: int,
               tick: Callable[[int], None]) -> tuple[list, list]:
    """(per token count: the pool's rate cells, per sample: a layer call's cost beyond its experts)."""
    n, H, dtype = w13.shape[0], shape.hidden, w13.dtype
    m = min(layer_experts, n)  # a layer's call groups over its own experts (at most the pool's here)
    cells, layer_s = [], []
    for i, t in enumerate(tokens):
        # One call of the runtime's CPU compute in which each of t tokens routes to every expert
        # of the pool: the experts one after another with t tokens each, the call's own cost
        # spread over the whole pool.
        x = torch.full((t, H), 0.5, dtype=dtype)
        ids, w = torch.arange(n).repeat(t, 1), torch.full((t, n), 0.25)

        def one_pass(x=x, ids=ids, w=w) -> None:
            stacked_experts(x, ids, w, w13, w2)

        # At the first token count, also the same experts one call each, as a run's layers
        # call it (a stack of a layer's m experts that holds expert e): the difference is what a
        # call costs beyond its experts (its output, grouping the routing by expert), paired
        # sample by sample against load changes.
        one_ids = [torch.full((t, 1), j, dtype=torch.int64) for j in range(m)]
        one_w = torch.full((t, 1), 0.25)

        def by_calls(x=x, one_ids=one_ids, one_w=one_w) -> None:
            for e in range(n):
                s = min(e, n - m)
                stacked_experts(x, one_ids[e - s], one_w, w13[s:s + m], w2[s:s + m])

        one_pass()  # warm-up: first-use costs (thread team start, kernel selection)
        seconds = []
        for _ in range(samples):
            seconds.append(wall_clock(one_pass))
            if i == 0:
                layer_s.append((wall_clock(by_calls) - seconds[-1]) / n)
        gbps = [n * shape.expert_bytes / s / 1e9 for s in seconds]
        cells.append((t, summarize(n * shape.expert_bytes, n, gbps)))
        tick(1)
    return cells, layer_s


def measure_cpu_expert(shape: ExpertShape, node: int | None, cpus: Sequence[int] | None,
                       pool_bytes: int = POOL_BYTES, tokens: Sequence[int] = TOKENS, samples: int = 5,
                       tick: Callable[[int], None] | None = None, threads: int | None = None,
                       layer_experts: int = DEFAULT_LAYER_EXPERTS) -> CpuExpertRate:
    """Time the expert pool for each token count on `node`'s memory with `cpus` (and `threads`
    torch threads, default one per CPU), and what one layer's call costs beyond its experts
    (`layer_experts` routed experts per layer)."""
    import torch

    tick = tick or (lambda n: None)
    dtype = getattr(torch, shape.dtype)
    reasons: list[Reason] = []
    n = pool_size(shape, pool_bytes)
    H, inter = shape.hidden, shape.inter
    pages = HostPages(n * shape.expert_bytes, node)
    if pages.location.detail and node is not None:
        reasons.append(Reason("node", pages.location.detail))
    # Laid out as the runtime's cold bank is (runtime/bank.py): one blob per expert, w13 then w2.
    blobs = pages.tensor()[: n * shape.expert_bytes].view(dtype).view(n, 3 * inter * H)
    w13 = blobs[:, : 2 * inter * H].unflatten(1, (2 * inter, H))
    w2 = blobs[:, 2 * inter * H:].unflatten(1, (H, inter))
    w13.fill_(0.01)
    w2.fill_(0.01)

    def timed() -> tuple[list, list]:
        return _time_pool(torch, shape, w13, w2, tokens, samples, layer_experts, tick)

    (cells, layer_s), threads = on_cpus(torch, cpus, timed, threads)
    handoff = measure_handoff_ms()
    layer_ms = max(0.0, statistics.median(layer_s) * 1e3) if layer_s else None
    return CpuExpertRate(node, tuple(cpus) if cpus else None, threads, shape, shape.expert_bytes, n, tuple(cells),
                         handoff, layer_ms, layer_experts, reasons=tuple(reasons))
