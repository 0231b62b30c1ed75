"""The CPU cold path (docs/runtime.md, "Cold paths"): per MoE layer and step, the distinct cold
experts are divided between the device (reading their weights in place, as ever) and a CPU
worker computing its share from the cold bank in host memory, by the cost model of
hotsplit_cli/hotset/coldpath.py (`cold_path` = gpu | cpu | split). Only activations cross the
link. Without a GPU the device is this CPU, and the CPU's share runs in the calling thread first:
a worker's own OpenMP team beside the caller's left cores idle (docs/benchmarks.md). Deciding the
split reads the routing on the host, so cpu/split steps are not captured in a CUDA graph."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from hotsplit_probes.bandwidth import measure_roundtrip_ms
from hotsplit_probes.cpu_expert import (
    CPU_RUNTIME_THREADS,
    ExpertShape,
    grouped_experts,
    measure_cpu_expert,
    stacked_experts,
)
from hotsplit_probes.sysfs import read_numa_node
from hotsplit_probes.timing import median_ms

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.coldpath import ColdRates, LayerSplit, describe_rates, fit_rates, split_cold

from .device import DeviceInfo, synchronizer

# Measured (benchmarks/bench_cpu_fp8.py, docs/benchmarks.md): dequantising a block-scaled fp8 expert on
# the CPU and computing it streams 25-45x fewer bytes of stored weights per second than bf16.
FP8_REFUSAL = ("cold_path {mode}: the CPU cannot compute fp8 experts usefully (dequantising them streams ~30-40x "
               "fewer bytes/s than bf16); use cold_path gpu, which reads fp8 tiles in place")
# Measured the same way (benchmarks/bench_cpu_cold_rate.py --precisions native,fp8,mxfp4, docs/benchmarks.md):
# the CPU path over mxfp4 banks streams 0.25 GB/s of stored bytes, about 60x below native.
MXFP4_REFUSAL = ("cold_path {mode}: the CPU cannot compute mxfp4 experts usefully (dequantising them streams ~60x "
                 "fewer bytes/s than bf16); use cold_path gpu")
# Distinct token counts a split remembers before it starts again (batch 64 rarely repeats one).
SPLITS_REMEMBERED = 1024


@dataclass
class PathCounters:
    """Cold work per path since the run began (bytes as allocated; ms measured and predicted)."""

    layers: int = 0  # layer calls with any cold expert
    cpu_layers: int = 0  # ... where the CPU took part
    gpu_experts: int = 0  # distinct cold experts the device read
    cpu_experts: int = 0  # ... the CPU computed
    gpu_bytes: int = 0
    cpu_bytes: int = 0
    gpu_ms: float = 0.0  # the device's expert compute, hot experts included (measured)
    cpu_ms: float = 0.0  # the CPU worker, hand-off and copies included (measured)
    gpu_pred_ms: float = 0.0  # the cost model's cold time for the device's share
    cpu_pred_ms: float = 0.0  # ... and for the CPU's (sync included)
    hot_pred_ms: float = 0.0  # the device's hot experts and layer calls where the device is this CPU (else 0)
    _events: list = field(default_factory=list)  # (start, end) CUDA events not yet read

    def settle(self, wait: bool = True) -> None:
        """Fold the device time of finished layers in (reads CUDA events; no-op on a CPU); without
        `wait`, only of the layers already done, so that a long run keeps few events."""
        while self._events and (wait or self._events[0][1].query()):
            start, end = self._events.pop(0)
            end.synchronize()
            self.gpu_ms += start.elapsed_time(end)


def node_cpus(node: int | None) -> tuple[int, ...] | None:
    """The CPUs of NUMA node `node` this process may use (None: unknown node, or none usable)."""
    if node is None:
        return None

    cpus = read_numa_node(node).cpus
    allowed = set(cpus or ()) & os.sched_getaffinity(0)
    return tuple(sorted(allowed)) or None


def _pin(cpus: tuple[int, ...] | None) -> None:
    """Run the calling (worker) thread on `cpus`, with as many torch threads (OpenMP's count is per
    thread); the rest of the process keeps its CPUs."""
    if cpus:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))


class ColdSplit:
    """Divides each layer's cold experts between the device compute and a CPU worker."""

    def __init__(self, mode: str, rates: ColdRates, info: DeviceInfo, rates_source: str = "",
                 rates_not_used: str | None = None):
        self.mode, self.rates, self.info = mode, rates, info
        self.rates_source = rates_source  # where the rates came from, for the run's header
        self.rates_not_used = rates_not_used  # platform.json's rates when they were for other experts (full size)
        self.counters = PathCounters()
        self._splits, self._splits_of = {}, rates  # (mode, expert bytes, token counts) -> LayerSplit
        self.cpus = node_cpus(info.numa_node)  # the worker runs next to the cold bank's memory
        self.pool = None
        if not rates.shared_cpu:  # a worker only where the CPU's share overlaps a GPU's
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="hotsplit-cold-cpu", initializer=_pin,
                                           initargs=(self.cpus,))
            weakref.finalize(self, self.pool.shutdown, wait=False)  # the worker goes with the split

    def __call__(self, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor, bank,
                 device_compute: Callable[[torch.Tensor], torch.Tensor],
                 cpu_compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The routed experts' output [T, H]. `device_compute(ids_TK)` computes the assignments of
        `ids_TK` (others -1) on the device; `cpu_compute(x, ids, w)` the given host rows on the CPU."""
        T, K = ids_TK.shape
        flat_A = ids_TK.reshape(-1).cpu().numpy()  # the one host read of the layer: the routing
        valid_A = flat_A >= 0
        cold_A = valid_A & (bank.served_E[np.where(valid_A, flat_A, 0)] < 0)
        counts_E = np.bincount(flat_A[cold_A], minlength=len(bank.served_E))  # np.unique's result, at a third
        experts = np.flatnonzero(counts_E)
        tokens = counts_E[experts]
        expert_bytes = bank.expert_bytes
        hot_A = valid_A & ~cold_A
        if self.rates.shared_cpu and hot_A.any():  # the device is this CPU: a hot expert costs as a cold one
            _, hot_tokens = np.unique(flat_A[hot_A], return_counts=True)
            hot_s = self.rates.gpu_seconds(np.full(len(hot_tokens), float(expert_bytes)), hot_tokens)
            self.counters.hot_pred_ms += float(hot_s.sum()) * 1e3  # its call's own cost: `_device`
        if len(experts) == 0:
            return self._device(device_compute, ids_TK)
        split = self._split(expert_bytes, tokens)
        c = self.counters
        c.layers += 1
        n_cpu = int(split.to_cpu_N.sum())
        c.gpu_experts += len(experts) - n_cpu
        c.cpu_experts += n_cpu
        c.gpu_bytes += (len(experts) - n_cpu) * expert_bytes
        c.cpu_bytes += n_cpu * expert_bytes
        c.gpu_pred_ms += split.gpu_s * 1e3
        c.cpu_pred_ms += split.cpu_s * 1e3
        if n_cpu == 0:
            return self._device(device_compute, ids_TK)
        c.cpu_layers += 1
        # Every cold expert to the CPU (mode cpu, or a split that gives it all): the cold
        # assignments themselves, without a set lookup per assignment on every layer call.
        to_cpu_A = cold_A if n_cpu == len(experts) else np.isin(flat_A, experts[split.to_cpu_N]) & valid_A
        return self._hand_out(x_TH, ids_TK, w_TK, flat_A, to_cpu_A, bool((valid_A & ~to_cpu_A).any()),
                              device_compute, cpu_compute)

    def _split(self, expert_bytes: int, tokens_N: np.ndarray) -> LayerSplit:
        """`split_cold` of the layer's cold experts, remembered per token counts: at decode the same
        counts come back on every layer call (batch 1: one token each), and the cost model's numpy
        took 0.05 ms of each warm, 0.1 ms with the caches cold after the experts (Qwen3-30B-A3B
        at batch 1: 2% of its 6 ms; docs/benchmarks.md)."""
        if self._splits_of is not self.rates:  # a split holds for one set of rates
            self._splits, self._splits_of = {}, self.rates
        key = (self.mode, expert_bytes, tokens_N.tobytes())
        split = self._splits.get(key)
        if split is None:
            if len(self._splits) >= SPLITS_REMEMBERED:
                self._splits.clear()
            split = self._splits[key] = split_cold(np.full(len(tokens_N), float(expert_bytes)), tokens_N,
                                                   self.rates, self.mode)
        return split

    def _hand_out(self, x_TH, ids_TK, w_TK, flat_A, to_cpu_A, device_part: bool, device_compute,
                  cpu_compute) -> torch.Tensor:
        """The CPU's assignments `to_cpu_A` computed on the CPU (the rows of their tokens), the
        rest on the device (none there when not `device_part`), the two outputs added."""
        T, K = ids_TK.shape
        tok = np.unique(np.flatnonzero(to_cpu_A) // K)  # the tokens the CPU serves (some of their k)
        every = len(tok) == T  # every token has CPU work: its rows as they are, no gather or scatter
        dev = x_TH.device
        tok_dev = None if every else torch.from_numpy(tok).to(dev)
        ids_cpu = torch.from_numpy(np.where(to_cpu_A, flat_A, -1).reshape(T, K)[tok])
        x_cpu, w_cpu = (x_TH, w_TK) if every else (x_TH.index_select(0, tok_dev), w_TK.index_select(0, tok_dev))
        x_cpu, w_cpu = x_cpu.cpu(), w_cpu.cpu()
        job = None if self.pool is None else self.pool.submit(self._cpu, cpu_compute, x_cpu, ids_cpu, w_cpu)
        if job is None:
            # The device is this CPU: the two paths share its cores and one interpreter lock, so
            # at once they only slow each other (the cost model adds them up). One after the
            # other in this thread, each takes the time its own experts cost, on one thread team.
            y_cpu = self._cpu(cpu_compute, x_cpu, ids_cpu, w_cpu)
        y_TH = None
        if device_part:
            ids_dev = ids_TK.masked_fill(torch.from_numpy(to_cpu_A.reshape(T, K)).to(dev), -1)
            y_TH = self._device(device_compute, ids_dev)  # launched (on a GPU) while the CPU works
        if job is not None:
            y_cpu = job.result()
        if y_TH is None:  # nothing for the device: the CPU's rows are the output (zero elsewhere)
            y_cpu = y_cpu.to(dev, x_TH.dtype)
            return y_cpu if every else torch.zeros_like(x_TH).index_add_(0, tok_dev, y_cpu)
        y_cpu = y_cpu.to(dev, y_TH.dtype)
        return y_TH + y_cpu if every else y_TH.index_add(0, tok_dev, y_cpu)

    def report(self, real_expert_bytes: int, allocated_expert_bytes: int | None = None) -> dict:
        """Per path: distinct cold experts, their bytes at full size and as allocated, ms achieved
        and predicted as allocated, the spread of the rate it was predicted at; the CPU's share."""
        c = self.counters
        c.settle()
        n = c.gpu_experts + c.cpu_experts
        alloc = allocated_expert_bytes or real_expert_bytes
        return {"mode": self.mode, "rates": self.rates_source, "rates_not_used": self.rates_not_used,
                "layers": c.layers, "layers_with_cpu": c.cpu_layers, "cpu_share": c.cpu_experts / n if n else 0.0,
                "hot_modelled": self.rates.shared_cpu,
                "gpu": {"experts": c.gpu_experts, "bytes": c.gpu_experts * real_expert_bytes,
                        "allocated_bytes": c.gpu_experts * alloc, "ms": c.gpu_ms,
                        "predicted_ms": c.gpu_pred_ms + c.hot_pred_ms, "hot_predicted_ms": c.hot_pred_ms,
                        "spread": self.rates.gpu_spread},
                "cpu": {"experts": c.cpu_experts, "bytes": c.cpu_experts * real_expert_bytes,
                        "allocated_bytes": c.cpu_experts * alloc, "ms": c.cpu_ms, "predicted_ms": c.cpu_pred_ms,
                        "spread": self.rates.cpu_spread}}

    def _device(self, device_compute, ids_TK: torch.Tensor) -> torch.Tensor:
        if self.rates.shared_cpu:
            self.counters.hot_pred_ms += self.rates.layer_ms  # the device (this CPU)'s call's own cost
        if self.info.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            y = device_compute(ids_TK)
            end.record()
            self.counters._events.append((start, end))
            self.counters.settle(wait=False)
            return y
        t0 = time.perf_counter()
        y = device_compute(ids_TK)
        self.counters.gpu_ms += (time.perf_counter() - t0) * 1e3
        return y

    def _cpu(self, cpu_compute, x, ids, w) -> torch.Tensor:
        t0 = time.perf_counter()
        y = cpu_compute(x, ids, w)
        self.counters.cpu_ms += (time.perf_counter() - t0) * 1e3
        return y

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


class SplitExperts:
    """An expert compute (TritonExperts or TorchExperts) with the cold experts divided by `split`:
    the synthetic runtime's banks (ExpertBank)."""

    capturable = False  # the split reads the routing on the host

    def __init__(self, inner, split: ColdSplit):
        self.inner, self.split = inner, split
        self.name = f"{inner.name} + CPU cold path ({split.mode})"

    def __call__(self, x_TH, ids_TK, w_TK, bank, counts_E=None) -> torch.Tensor:
        return self.split(
            x_TH, ids_TK, w_TK, bank,
            lambda ids: self.inner(x_TH, ids, w_TK, bank, counts_E),
            host_compute(bank))


def host_compute(bank) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The CPU's compute over `bank`'s host cold bank: a native bank's stacked views in one grouped
    matmul per projection, or expert by expert where few are used (`stacked_experts`, what the
    probe times), stored experts dequantised one at a time."""
    stack = bank.host_stack
    if stack is not None:
        return lambda x, ids, w: stacked_experts(x, ids, w, *stack)
    return lambda x, ids, w: grouped_experts(x, ids, w, bank.host_weights_of, bank.num_experts)


class SplitBank:
    """A checkpoint layer's experts (hf/bank.py `HFExpertBank`) with the cold experts divided by
    `split`: the adapter's `.forward(experts, x, ids, w)`."""

    def __init__(self, bank, split: ColdSplit):
        self.bank, self.split = bank, split

    def forward(self, experts, x_TH, ids_TK, w_TK) -> torch.Tensor:
        b = self.bank
        return self.split(x_TH, ids_TK, w_TK, b, lambda ids: b.forward(experts, x_TH, ids, w_TK),
                          lambda x, ids, w: b.forward(experts, x, ids, w, host=True))


# A quick measurement at the start of a run: the pool is read 35 times (a warm-up and 5 samples at
# each of probes/cpu_expert.py's 5 TOKENS, and 5 passes of one call per expert for the layer call).
CALIBRATION_POOL_BYTES = 64 << 20


def measure_rates(bank, info: DeviceInfo, zero_copy_gbps: float | None = None) -> tuple[ColdRates, str]:
    """The cost model's rates measured now on this run's expert shape by the probe's measurement
    (probes.cpu_expert); on a CPU the device path is this same CPU (`shared_cpu`)."""
    shape = ExpertShape(bank.hidden, bank.inter, str(bank.compute_dtype).replace("torch.", ""))
    cpu = measure_cpu_expert(shape, info.numa_node, node_cpus(info.numa_node), pool_bytes=CALIBRATION_POOL_BYTES,
                             samples=5, threads=None if info.is_cuda else CPU_RUNTIME_THREADS,
                             layer_experts=bank.num_experts)
    points = tuple((float(t), m.median_gbps) for t, m in cpu.by_tokens)
    spread = max((m.spread_gbps / m.median_gbps for _, m in cpu.by_tokens if m.median_gbps), default=0.0)
    sync_ms, zero_copy = cpu.handoff_ms, None
    if info.is_cuda:
        sync_ms += measure_roundtrip_ms(torch, info.device)
        zero_copy = zero_copy_gbps or _zero_copy_gbps(bank, info)
    rates = ColdRates(zero_copy, points, sync_ms, shared_cpu=not info.is_cuda, spread=spread,
                      layer_ms=cpu.layer_ms or 0.0, gpu_spread=None if info.is_cuda else spread, cpu_spread=spread)
    shape_text = f"{shape.hidden}x{shape.inter} {shape.dtype}, {cpu.threads} thread{'s' * (cpu.threads != 1)}"
    return rates, "measured now for the experts this run allocates: " + describe_rates(rates, shape_text)


def _zero_copy_gbps(bank, info: DeviceInfo, max_bytes: int = 1 << 30) -> float:
    """GB/s of a reduction over (up to 1 GiB of) the cold blobs read in place, as float32 words."""
    flat = bank.cold_read_EB.reshape(-1).view(torch.uint8)
    n = min(flat.numel(), max_bytes) // 4 * 4
    words = flat[:n].view(torch.float32)
    words.sum()  # warm-up
    return n / median_ms(words.sum, 5, synchronizer(info)) / 1e6


def make_split(mode: str, info: DeviceInfo, bank, platform=None) -> ColdSplit | None:
    """The CPU cold path of `mode` (None for `gpu`) at coldpath.fit_rates's rates: platform.json's when
    measured on the experts this run allocates, else measured now (the platform's reported unused)."""
    if mode == "gpu":
        return None
    if getattr(bank, "fp8_meta", None) is not None:
        raise UsageError(FP8_REFUSAL.format(mode=mode))
    if getattr(bank, "precision", "native") == "mxfp4":
        raise UsageError(MXFP4_REFUSAL.format(mode=mode))
    not_used = None
    if platform is not None:
        gpu = platform.gpu_of_cuda(info.device.index or 0) if info.is_cuda else None
        fitted = fit_rates(platform, bank.hidden, bank.inter, str(bank.compute_dtype).replace("torch.", ""),
                           gpu.index if gpu else None, device_is_cpu=not info.is_cuda)
        if fitted.mismatch is None and fitted.compute_bytes is None:
            rates, where = fitted.rates, fitted.where
        else:
            rates, where = measure_rates(bank, info, fitted.rates.zero_copy_gbps)
            not_used = f"{fitted.where} ({fitted.mismatch or 'other experts'}: full-size figures, not used)"
    else:
        rates, where = measure_rates(bank, info)
    return ColdSplit(mode, rates, info, where, not_used)
