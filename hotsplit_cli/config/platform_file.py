"""Read platform.json (`hotsplit.platform/1`, written by `hotsplit probe`) for other commands.

Only the figures planning needs, validated: per GPU free/total memory, the measured
zero-copy read and host->device copy rates and the compute rate through resident weights; for
CPU-only machines the host copy rate; the CPU expert rate per NUMA node and the
synchronisation costs of a CPU cold path.
Every number is checked (finite, >= 0, or null) and an error names the file and field.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hotsplit_probes.common import gpu_of_cuda

from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.core.jsonio import read_json_doc

KIND = "platform"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of platform.json. Rates in GB/s (1e9 B/s); None where the probe could not measure."""

    index: int  # the driver's index (nvidia-smi order)
    cuda_index: int | None  # torch.cuda index, None when CUDA could not use it
    name: str | None
    mem_free_bytes: int | None  # free when probed (before this process made a CUDA context)
    mem_total_bytes: int | None
    zero_copy_read_gbps: float | None  # SM reads of pinned host memory, local NUMA node, largest size
    h2d_gbps: float | None  # copy-engine pinned host -> device, same node and size
    numa_node: int | None
    link_rate_gbps: float | None  # theoretical PCIe rate the link ran at under load
    roundtrip_ms: float | None = None  # activations to the host and back (a CPU cold path's per-layer cost)
    zero_copy_read_spread: float | None = None  # (max - min) / median of that read (older probes: None)
    # (tokens, GB/s of resident weights computed through), probes/gpu_compute.py; () when the
    # file records none (older probes, or not measured: `reasons` says why)
    compute_points: tuple[tuple[int, float], ...] = ()

    def compute_gbps(self, tokens: float) -> float | None:
        """The compute rate at `tokens`: log-log interpolated between the measured token counts,
        the end points' beyond them; None when not measured."""
        if not self.compute_points:
            return None
        t, g = zip(*self.compute_points, strict=True)
        return float(math.exp(np.interp(math.log(max(tokens, 1e-9)), np.log(t), np.log(g))))


@dataclass(frozen=True)
class CpuExpertInfo:
    """The probe's CPU expert rate with one NUMA node's threads (GB/s of expert weights)."""

    node: int | None
    points: tuple[tuple[float, float], ...]  # (tokens per expert, median GB/s)
    handoff_ms: float | None  # a task to a worker thread and back
    shape: str  # the expert it computed, for the report: "HIDDENxINTER DTYPE"
    spread: float | None = None  # the largest (max - min) / median of its points (None: the file records none)
    threads: int | None = None
    layer_ms: float | None = None  # one layer's call of the grouped compute beyond its experts (older probes: None)

    def fits(self, hidden: int, inter: int, dtype: str) -> bool:
        """Whether these rates were measured on experts of this shape and dtype."""
        return self.shape == f"{hidden}x{inter} {dtype}"


@dataclass(frozen=True)
class PlatformInfo:
    path: Path
    created: str
    gpus: tuple[GpuInfo, ...]  # empty on a CPU-only machine
    host_copy_gbps: float | None  # host memory copy rate: what a CPU runtime reads experts at
    host_mem_available_bytes: int | None
    numa_nodes: int
    reasons: tuple[str, ...]  # "field: why", for every figure the probe could not measure
    cpu_expert: tuple[CpuExpertInfo, ...] = ()  # empty when the probe did not measure it

    def cpu_expert_near(self, node: int | None) -> CpuExpertInfo | None:
        """The CPU expert rate measured on `node` (a GPU's node), else the first one measured."""
        return next((c for c in self.cpu_expert if c.node == node), self.cpu_expert[0] if self.cpu_expert else None)

    def gpu_of_cuda(self, cuda_index: int) -> GpuInfo | None:
        """The GPU torch calls `cuda:cuda_index`, None when the probe saw none there."""
        return gpu_of_cuda(self.gpus, cuda_index)

    def gpu(self, index: int = 0) -> GpuInfo:
        """The GPU with driver index `index`; InputFileError when the file has none."""
        for g in self.gpus:
            if g.index == index:
                return g
        have = ", ".join(str(g.index) for g in self.gpus) or "none"
        raise InputFileError(f"{self.path}: no GPU {index} (GPUs: {have})",
                             "run `hotsplit probe -o platform.json` on the GPU machine")


def _number(value: Any, where: str, integer: bool = False) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise InputFileError(f"{where}: must be {kind} or null, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InputFileError(f"{where}: must be finite and >= 0, got {value!r}")
    return value


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise InputFileError(f"{where}: must be an object, got {type(value).__name__}")
    return value


def load_platform(path: str | os.PathLike) -> PlatformInfo:
    """Read and validate platform.json. Raises InputFileError naming the file and field."""
    path = Path(path)
    doc = read_json_doc(path, KIND)
    for key in ("created", "host", "gpus", "reasons"):
        if key not in doc:
            raise InputFileError(f"{path}: missing key {key!r}", "re-run `hotsplit probe -o platform.json`")
    host = _object(doc["host"], f"{path}: host")
    nodes = host.get("numa_nodes")
    if not isinstance(nodes, list):
        raise InputFileError(f"{path}: host.numa_nodes: must be a list")
    if not isinstance(doc["gpus"], list):
        raise InputFileError(f"{path}: gpus: must be a list")
    gpus = []
    for i, raw in enumerate(doc["gpus"]):
        where = f"{path}: gpus[{i}]"
        g = _object(raw, where)
        summary = _object(g.get("summary") or {}, f"{where}.summary")
        index = _number(g.get("index"), f"{where}.index", integer=True)
        if index is None:
            raise InputFileError(f"{where}.index: missing")
        name = g.get("name")
        gpus.append(GpuInfo(
            index=index,
            cuda_index=_number(g.get("cuda_index"), f"{where}.cuda_index", integer=True),
            name=name if isinstance(name, str) else None,
            mem_free_bytes=_number(g.get("mem_free_bytes"), f"{where}.mem_free_bytes", integer=True),
            mem_total_bytes=_number(g.get("mem_total_bytes"), f"{where}.mem_total_bytes", integer=True),
            zero_copy_read_gbps=_number(summary.get("zero_copy_read_gbps"), f"{where}.summary.zero_copy_read_gbps"),
            h2d_gbps=_number(summary.get("h2d_gbps"), f"{where}.summary.h2d_gbps"),
            numa_node=_number(g.get("numa_node"), f"{where}.numa_node", integer=True),
            link_rate_gbps=_number(g.get("link_rate_gbps"), f"{where}.link_rate_gbps"),
            roundtrip_ms=_number((g.get("bandwidth") or {}).get("roundtrip_ms"), f"{where}.bandwidth.roundtrip_ms"),
            zero_copy_read_spread=_number(summary.get("zero_copy_read_spread"),
                                          f"{where}.summary.zero_copy_read_spread"),
            compute_points=_compute(g.get("compute"), f"{where}.compute"),
        ))
    if not isinstance(doc["reasons"], list):
        raise InputFileError(f"{path}: reasons: must be a list")
    reasons = []
    for i, r in enumerate(doc["reasons"]):
        if isinstance(r, dict) and "field" in r and "reason" in r:
            reasons.append(f"{r['field']}: {r['reason']}")
        else:
            raise InputFileError(f"{path}: reasons[{i}]: must be an object with field and reason")
    created = doc["created"] if isinstance(doc["created"], str) else ""
    return PlatformInfo(
        path=path,
        created=created,
        gpus=tuple(gpus),
        host_copy_gbps=_number(host.get("copy_gbps"), f"{path}: host.copy_gbps"),
        host_mem_available_bytes=_number(host.get("mem_available_bytes"), f"{path}: host.mem_available_bytes",
                                         integer=True),
        numa_nodes=len(nodes),
        reasons=tuple(reasons),
        cpu_expert=_cpu_expert(host.get("cpu_expert"), f"{path}: host.cpu_expert"),
    )


def _compute(raw: Any, where: str) -> tuple[tuple[int, float], ...]:
    """gpus[i].compute (absent in files of older probes, null when not measured): its by_tokens
    cells [tokens, {"median_gbps": GB/s}], token counts rising, rates > 0."""
    if raw is None:
        return ()
    cells = _object(raw, where).get("by_tokens")
    if not isinstance(cells, list) or not cells:
        raise InputFileError(f"{where}.by_tokens: must be a non-empty list of [tokens, measurement]")
    points = []
    for j, cell in enumerate(cells):
        if not (isinstance(cell, list) and len(cell) == 2 and isinstance(cell[1], dict)):
            raise InputFileError(f"{where}.by_tokens[{j}]: must be [tokens, measurement]")
        tokens = _number(cell[0], f"{where}.by_tokens[{j}][0]", integer=True)
        gbps = _number(cell[1].get("median_gbps"), f"{where}.by_tokens[{j}].median_gbps")
        if not tokens or not gbps or (points and tokens <= points[-1][0]):
            raise InputFileError(f"{where}.by_tokens[{j}]: tokens must rise from 1 and GB/s be > 0, got "
                                 f"[{tokens!r}, {gbps!r}]", "re-run `hotsplit probe -o platform.json`")
        points.append((tokens, float(gbps)))
    return tuple(points)


def _cpu_expert(raw: Any, where: str) -> tuple[CpuExpertInfo, ...]:
    """host.cpu_expert (absent in files of older probes, null when not measured)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputFileError(f"{where}: must be a list or null")
    out = []
    for i, entry in enumerate(raw):
        e = _object(entry, f"{where}[{i}]")
        cells = e.get("by_tokens")
        if not isinstance(cells, list):
            raise InputFileError(f"{where}[{i}].by_tokens: must be a list")
        points, spreads = [], []
        for j, cell in enumerate(cells):
            if not (isinstance(cell, list) and len(cell) == 2 and isinstance(cell[1], dict)):
                raise InputFileError(f"{where}[{i}].by_tokens[{j}]: must be [tokens, measurement]")
            tokens = _number(cell[0], f"{where}[{i}].by_tokens[{j}][0]", integer=True)
            gbps = _number(cell[1].get("median_gbps"), f"{where}[{i}].by_tokens[{j}].median_gbps")
            spread = _number(cell[1].get("spread_gbps"), f"{where}[{i}].by_tokens[{j}].spread_gbps")
            if tokens is not None and gbps is not None:
                points.append((float(tokens), float(gbps)))
                if spread is not None and gbps > 0:
                    spreads.append(spread / gbps)
        shape = e.get("shape") if isinstance(e.get("shape"), dict) else {}
        out.append(CpuExpertInfo(_number(e.get("node"), f"{where}[{i}].node", integer=True), tuple(points),
                                 _number(e.get("handoff_ms"), f"{where}[{i}].handoff_ms"),
                                 f"{shape.get('hidden')}x{shape.get('inter')} {shape.get('dtype')}",
                                 max(spreads, default=None), _number(e.get("threads"), f"{where}[{i}].threads",
                                                                    integer=True),
                                 _number(e.get("layer_ms"), f"{where}[{i}].layer_ms")))
    return tuple(out)
