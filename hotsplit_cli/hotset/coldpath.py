"""Who computes the cold experts: the GPU reading their weights over PCIe (zero-copy, `gpu`), the
CPU computing them where they lie in the cold bank (`cpu`), or both at once (`split`), divided so
that the two finish together. Pure numpy; the runtime and the planner both use it.

Cost model, for the distinct cold experts one MoE layer reads in one step (seconds):

    GPU part  G:  sum_{e in G} bytes_e / zero_copy_rate                      (weights cross the link)
    CPU part  C:  sum_{e in C} bytes_e / cpu_rate(tokens_e) + sync + layer   (when C is not empty)
    layer cold time = max(GPU part, CPU part)                                 (they run at once)

`cpu_rate(t)` is the probe's CPU expert rate at t tokens per expert: it falls as t grows (the CPU
turns compute-bound) while the GPU's arithmetic is nearly free, so experts with many tokens
favour the GPU. An expert never costs less for more tokens: the measured points are read as
their running minimum over tokens (a probe point above a smaller token count's is noise or a
kernel quirk the runtime cannot exploit), so every predicted time grows with the batch. `sync` is
the fixed per-layer cost of involving the CPU at all (routing and activations to the host, the
CPU's outputs back, a worker hand-off); `layer` what the CPU's grouped compute costs per layer
call beyond its experts (its output buffer, grouping the routing by expert: measured by the probe
on that very code, probes/cpu_expert.py). Without a GPU the device path pays `layer` too, on every
layer call whichever path takes the cold experts: a run predicts it with the hot experts.

Without a GPU (`shared_cpu`) the device path is this same CPU, computing its experts at the CPU
expert rate on the cores the CPU path would use: the two parts add up instead of overlapping,
so the split gains nothing and gives the CPU path nothing (measured: benchmarks/bench_cold_path.py).

The split: order the cold experts by how much more the CPU pays for them than the GPU
(cpu time / gpu time, ties by expert id), then give the CPU the prefix that minimises the
layer's cold time. With equal rates and no sync cost that is half the bytes; with no CPU rate it
is nothing; an expert with many tokens is the last the CPU would take. A worked example is in
docs/runtime.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hotsplit_probes.cpu_expert import CPU_RUNTIME_DTYPE, DTYPE_BYTES, interpolate_gbps

from hotsplit_cli.config.knobs import COLD_PATHS
from hotsplit_cli.core.errors import UsageError


@dataclass(frozen=True)
class ColdRates:
    """The measured rates the cost model uses (GB/s = 1e9 B/s)."""

    zero_copy_gbps: float | None  # the GPU's zero-copy read of pinned host memory
    cpu_points: tuple[tuple[float, float], ...]  # (tokens per expert, CPU expert GB/s), measured
    sync_ms: float = 0.0  # per layer, when the CPU takes part
    shared_cpu: bool = False  # no GPU: the device path is this CPU, at the CPU expert rate, on the same cores
    spread: float = 0.0  # the measurements' relative spread ((max - min) / median): closer times are a tie
    layer_ms: float = 0.0  # one layer call of the CPU's grouped compute, beyond its experts
    # The relative spread of each path's own rate, which a run's time verdict is banded by (None:
    # its source records none, e.g. a platform.json of an older probe): device path, CPU path.
    gpu_spread: float | None = None
    cpu_spread: float | None = None

    def cpu_gbps(self, tokens: float) -> float:
        """CPU expert rate at `tokens` tokens per expert (0 when unmeasured), never higher than
        at fewer tokens (the running minimum of the measured points)."""
        pts, low = [], np.inf
        for t, g in sorted(self.cpu_points):
            low = min(low, g)
            pts.append((t, low))
        return interpolate_gbps(pts, tokens) or 0.0

    def gpu_seconds(self, bytes_N: np.ndarray, tokens_N: np.ndarray | None = None) -> np.ndarray:
        """The device path's time per expert: its zero-copy read, or without a GPU this CPU's."""
        if self.shared_cpu:
            return self.cpu_seconds(bytes_N, np.ones(np.shape(bytes_N)) if tokens_N is None else tokens_N)
        if not self.zero_copy_gbps:
            return np.full(np.shape(bytes_N), np.inf)
        return np.asarray(bytes_N, dtype=np.float64) / (self.zero_copy_gbps * 1e9)

    def cpu_seconds(self, bytes_N: np.ndarray, tokens_N: np.ndarray) -> np.ndarray:
        # A layer's token counts repeat (mostly 1 and 2 at decode): one rate per distinct count,
        # since the runtime asks on every layer call (runtime/cold_split.py).
        counts, inverse = np.unique(np.asarray(tokens_N, dtype=np.float64).ravel(), return_inverse=True)
        rates = np.array([self.cpu_gbps(t) for t in counts], dtype=np.float64)[inverse]
        with np.errstate(divide="ignore"):
            return np.where(rates > 0, np.asarray(bytes_N, dtype=np.float64) / (rates * 1e9), np.inf)


@dataclass(frozen=True)
class LayerSplit:
    """One layer's cold experts divided between the two paths."""

    to_cpu_N: np.ndarray  # bool [N]: computed by the CPU
    gpu_s: float  # predicted GPU part
    cpu_s: float  # predicted CPU part (sync included when the CPU takes any)
    shared_cpu: bool = False  # the two parts run one after the other on one CPU

    @property
    def seconds(self) -> float:
        return self.gpu_s + self.cpu_s if self.shared_cpu else max(self.gpu_s, self.cpu_s)


def split_cold(bytes_N: Sequence[float], tokens_N: Sequence[float], rates: ColdRates, mode: str = "split"
               ) -> LayerSplit:
    """Divide N distinct cold experts (their bytes and token counts) between the GPU and the CPU.

    `gpu`: all to the GPU; `cpu`: all to the CPU; `split`: the prefix rule above."""
    if mode not in COLD_PATHS:
        raise UsageError(f"cold_path: must be one of {', '.join(COLD_PATHS)}, got {mode!r}")
    b, t = np.asarray(bytes_N, dtype=np.float64), np.asarray(tokens_N, dtype=np.float64)
    n = len(b)
    sync_s = (rates.sync_ms + rates.layer_ms) / 1e3  # what the CPU pays per layer for taking part
    if mode == "gpu" or n == 0:  # each path's times only where they are read: a run asks per layer call
        return LayerSplit(np.zeros(n, dtype=bool), float(rates.gpu_seconds(b, t).sum()) if n else 0.0, 0.0,
                          rates.shared_cpu)
    cpu = rates.cpu_seconds(b, t)
    if mode == "cpu":
        return LayerSplit(np.ones(n, dtype=bool), 0.0, float(cpu.sum()) + sync_s, rates.shared_cpu)
    gpu = rates.gpu_seconds(b, t)
    with np.errstate(divide="ignore", invalid="ignore"):
        penalty = np.where(np.isfinite(cpu), cpu / np.where(gpu > 0, gpu, np.inf), np.inf)
    order = np.lexsort((np.arange(n), penalty))  # cheapest for the CPU first, then by expert id
    cpu_part = np.concatenate([[0.0], np.cumsum(cpu[order]) + sync_s])  # the CPU takes the first k
    gpu_part = np.concatenate([np.cumsum(gpu[order][::-1])[::-1], [0.0]])  # the GPU the rest
    # One CPU doing both (no GPU) adds them up; a GPU and the CPU work at once.
    cost = gpu_part + cpu_part if rates.shared_cpu else np.maximum(gpu_part, cpu_part)
    k = int(np.argmin(cost))  # the first minimum: the fewest experts to the CPU
    to_cpu = np.zeros(n, dtype=bool)
    to_cpu[order[:k]] = True
    return LayerSplit(to_cpu, float(gpu_part[k]), float(cpu_part[k]), rates.shared_cpu)


@dataclass(frozen=True)
class ModeTimes:
    """Predicted cold time per decode step (all layers) of each cold path at one batch size."""

    batch: int
    gpu_ms: float | None
    cpu_ms: float | None
    split_ms: float | None
    cpu_share: float  # expected share of cold bytes the split gives the CPU
    spread: float = 0.0  # relative: times closer than this to the fastest are a tie

    def _times(self) -> dict[str, float]:
        return {m: t for m, t in (("gpu", self.gpu_ms), ("cpu", self.cpu_ms), ("split", self.split_ms))
                if t is not None and np.isfinite(t)}

    @property
    def tied(self) -> tuple[str, ...]:
        """The paths within the spread of the quickest, simplest first (gpu, cpu, split)."""
        times = self._times()
        if not times:
            return ()
        best = min(times.values())
        return tuple(m for m in COLD_PATHS if m in times and times[m] <= best * (1 + self.spread) + 1e-12)

    @property
    def fastest(self) -> str | None:
        """The quickest path, or among paths tied with it the simplest: a faster time inside the
        measurements' spread is no reason to pick the more involved path."""
        tied = self.tied
        return tied[0] if tied else None

    def to_doc(self) -> dict:
        return {"batch": self.batch, "gpu_ms": self.gpu_ms, "cpu_ms": self.cpu_ms, "split_ms": self.split_ms,
                "split_cpu_share": self.cpu_share, "fastest": self.fastest, "tied": list(self.tied)}


def fastest_spans(by_batch: Sequence[dict]) -> str:
    """The fastest path over runs of consecutive batch sizes (`ModeTimes.to_doc` rows), with the
    paths tied with it: "gpu (batch 1-8), split (batch 16-256; gpu within the spread: a tie)"."""
    runs: list[list] = []  # [path, tied, first batch, last batch]
    for b in by_batch:
        tied = tuple(m for m in b.get("tied", ()) if m != b["fastest"])
        if runs and runs[-1][:2] == [b["fastest"], tied]:
            runs[-1][3] = b["batch"]
        else:
            runs.append([b["fastest"], tied, b["batch"], b["batch"]])
    return ", ".join(f"{p} (batch {lo}{'' if lo == hi else f'-{hi}'}"
                     f"{'; ' + ' and '.join(t) + ' within the spread: a tie' if t else ''})"
                     for p, t, lo, hi in runs if p)


def rates_from_platform(platform, gpu_index: int | None = None, device_is_cpu: bool = False
                        ) -> tuple[ColdRates, str]:
    """The cost model's rates from platform.json (`platform_file.PlatformInfo`), by the one rule
    that `plan`, `simulate` and `run` share: GPU `gpu_index`'s zero-copy read (None: the slowest
    measured GPU, which bounds a TP step, as budget.choose_read_rate picks it), the CPU expert rate
    measured on its NUMA node, and the per-layer sync cost (worker hand-off + activations' round
    trip). With no GPU measured, or `device_is_cpu` (a run on a machine without CUDA), the device
    path is this CPU (`shared_cpu`). Returns (rates, where they came from)."""
    gpu, cpu = _gpu_and_cpu(platform, gpu_index)
    shared = device_is_cpu or gpu is None or not gpu.zero_copy_read_gbps
    sync = ((cpu.handoff_ms or 0.0) if cpu else 0.0) + ((gpu.roundtrip_ms or 0.0) if gpu and not shared else 0.0)
    cpu_spread = cpu.spread if cpu else None
    rates = ColdRates(None if shared else gpu.zero_copy_read_gbps, cpu.points if cpu else (), sync, shared,
                      cpu_spread or 0.0, (cpu.layer_ms or 0.0) if cpu else 0.0,
                      gpu_spread=cpu_spread if shared else gpu.zero_copy_read_spread, cpu_spread=cpu_spread)
    return rates, f"{platform.path}: " + describe_rates(rates, cpu.shape if cpu else None)


@dataclass(frozen=True)
class FittedRates:
    """platform.json's rates for experts of one shape: what the times are computed with."""

    rates: ColdRates
    where: str  # where they came from, as a user reads it
    compute_bytes: int | None  # bytes of one expert as the measured CPU computes it (None: the expert bytes)
    mismatch: str | None  # why the CPU figures are for other experts, else None


def fit_rates(platform, hidden: int, inter: int, dtype: str, gpu_index: int | None = None,
              device_is_cpu: bool = False) -> FittedRates:
    """`rates_from_platform`, checked against the experts they will time ([hidden, inter] in
    `dtype`). Without a GPU the probe measured the experts as the CPU runtime computes them
    (float32): the times are then for those bytes."""
    rates, where = rates_from_platform(platform, gpu_index, device_is_cpu)
    _, cpu = _gpu_and_cpu(platform, gpu_index)
    if not rates.cpu_points or cpu is None:
        return FittedRates(rates, where, None, None)
    if cpu.fits(hidden, inter, dtype):
        return FittedRates(rates, where, None, None)
    if rates.shared_cpu and cpu.fits(hidden, inter, CPU_RUNTIME_DTYPE):
        return FittedRates(rates, where, 3 * hidden * inter * DTYPE_BYTES[CPU_RUNTIME_DTYPE], None)
    return FittedRates(rates, where, None, f"{platform.path}: the CPU expert rate was measured on {cpu.shape} "
                                           f"experts, not these {hidden}x{inter} {dtype} ones")


def _gpu_and_cpu(platform, gpu_index: int | None):
    """The GPU whose zero-copy read the rule takes, and the CPU expert rate of its node."""
    if gpu_index is None:
        measured = [g for g in platform.gpus if g.zero_copy_read_gbps]
        gpu = min(measured, key=lambda g: g.zero_copy_read_gbps) if measured else None
    else:
        gpu = next((g for g in platform.gpus if g.index == gpu_index), None)
    return gpu, platform.cpu_expert_near(None if gpu is None else gpu.numa_node)


def describe_rates(rates: ColdRates, shape: str | None) -> str:
    """The rates as a user reads them: device path, CPU rate and its expert shape, sync."""
    if rates.shared_cpu:
        device = "no GPU: the device path is this CPU"
    else:
        device = f"zero-copy {rates.zero_copy_gbps:.1f} GB/s" if rates.zero_copy_gbps else "no zero-copy rate"
    cpu = (f"CPU {rates.cpu_points[0][1]:.1f} GB/s at {rates.cpu_points[0][0]:g} token ({shape})"
           if rates.cpu_points else "no CPU expert rate")
    spread = f", spread {100 * rates.spread:.0f}%" if rates.spread else ""
    layer = f", layer call {rates.layer_ms:.3f} ms" if rates.layer_ms else ""
    return f"{device}, {cpu}{spread}, sync {rates.sync_ms:.3f} ms/layer{layer}"


def _finite_ms(seconds: float) -> float | None:
    return seconds * 1e3 if np.isfinite(seconds) else None


def predict_cold_paths(pi_LE: np.ndarray, hot_LE: np.ndarray, expert_bytes: int | np.ndarray, rates: ColdRates,
                       batches: Sequence[int]) -> list[ModeTimes]:
    """Expected cold time per decode step of each cold path, per batch size.

    pi_LE: the chance one token routes to expert e of layer l (top_k x its share in the layer).
    At batch B a cold expert is read with probability q = 1 - (1 - pi)^B, by B pi / q tokens when
    it is: each layer's cold experts enter the split as expected bytes (q x expert bytes) with that
    token count. Layers run one after another, so their times add up. expert_bytes: one figure,
    or [L, E] when experts are stored at different precisions."""
    size_LE = np.broadcast_to(np.asarray(expert_bytes, dtype=np.float64), np.shape(pi_LE))
    out = []
    for batch in batches:
        layers = []
        for pi_E, hot_E, size_E in zip(pi_LE, hot_LE, size_LE, strict=True):
            p = pi_E[~hot_E]
            q = 1.0 - (1.0 - p) ** batch
            read = q > 0
            layers.append((q[read] * size_E[~hot_E][read], batch * p[read] / q[read]))
        out.append(_times_of(layers, rates, batch, 1))
    return out


def replay_cold_paths(counts_SLE: np.ndarray, hot_LE: np.ndarray, expert_bytes, rates: ColdRates,
                      batch: int) -> ModeTimes:
    """Mean cold time per step of each cold path over a routing trace with a fixed hot set: each
    step's distinct cold experts and their token counts, split as the runtime splits them.
    `expert_bytes`: one expert's stored bytes, or each expert's [L, E] (an auto plan's)."""
    sizes_LE = np.broadcast_to(np.asarray(expert_bytes, dtype=np.float64), hot_LE.shape)
    layers = []
    for counts_LE in counts_SLE:
        for counts_E, hot_E, sizes_E in zip(counts_LE, hot_LE, sizes_LE, strict=True):
            cold = (counts_E > 0) & ~hot_E
            layers.append((sizes_E[cold], counts_E[cold]))
    return _times_of(layers, rates, batch, max(len(counts_SLE), 1))


def _times_of(layers, rates: ColdRates, batch: int, steps: int) -> ModeTimes:
    """Each path's time over `layers` [(bytes_N, tokens_N)], per step, and the split's CPU share."""
    totals = dict.fromkeys(COLD_PATHS, 0.0)
    cpu_bytes = all_bytes = 0.0
    for b, t in layers:
        for mode in COLD_PATHS:
            s = split_cold(b, t, rates, mode)
            totals[mode] += s.seconds
            if mode == "split":
                cpu_bytes += float(b[s.to_cpu_N].sum())
        all_bytes += float(b.sum())
    return ModeTimes(batch, *(_finite_ms(totals[m] / steps) for m in COLD_PATHS),
                     cpu_bytes / all_bytes if all_bytes else 0.0, rates.spread)
