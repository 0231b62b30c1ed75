"""Choose the device once and detect what it can do; every later branch reads this record.

Feature detection happens here at construction time, never at import time: a machine without
CUDA (or without Triton) gets the slower paths that still work, each with a reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hotsplit_probes.gpu_numa import locate_gpu_numa_node
from hotsplit_probes.timing import Clock, cuda_event_clock, wall_clock

from hotsplit_cli.core.errors import UsageError


@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    name: str
    is_cuda: bool
    pinned: bool  # the cold bank can be page-locked (CUDA present)
    zero_copy: bool  # kernels can read pinned host memory in place (UVA)
    triton: bool  # the Triton expert kernels can run here (CUDA, or TRITON_INTERPRET=1 on a CPU)
    graphs: bool  # a step can be captured in a CUDA graph
    numa_node: int | None  # host NUMA node closest to the GPU (None: unknown or no GPU)
    reasons: dict[str, str] = field(default_factory=dict)  # feature -> why it is off

    def to_doc(self) -> dict:
        return {
            "device": str(self.device), "name": self.name, "pinned": self.pinned, "zero_copy": self.zero_copy,
            "triton": self.triton, "graphs": self.graphs, "numa_node": self.numa_node, "reasons": dict(self.reasons),
        }


def _triton_importable() -> tuple[bool, str | None]:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising at import
        return False, f"triton not importable ({type(exc).__name__}: {exc})"
    return True, None


def _gpu_numa_node(index: int) -> tuple[int | None, str | None]:
    """The NUMA node of GPU `index` by the probe's rule (probes/gpu_numa.py: sysfs, then NVML,
    then memory affinity, then the only node), so the runtime pins where the probe measured."""
    try:
        props = torch.cuda.get_device_properties(index)
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception as exc:  # older torch without the PCI fields
        return None, f"PCI bus id unknown ({exc})"
    located = locate_gpu_numa_node(bus)
    return located.node, located.why_not


def choose_device(request: str = "auto", source: str = "run.device") -> DeviceInfo:
    """`auto` takes cuda:0 when CUDA works, else the CPU; `cpu`, `cuda`, `cuda:N` are honoured or
    refused (UsageError) naming `source`, where the request came from (recipe key or flag)."""
    request = (request or "auto").strip().lower()
    fix = "use device: auto or cpu" if source == "run.device" else f"use {source} auto or cpu"
    if request not in ("auto", "cpu", "cuda") and not request.startswith("cuda:"):
        raise UsageError(f"{source}: must be auto, cpu, cuda or cuda:N, got {request!r}")
    reasons: dict[str, str] = {}
    want_cuda = request != "cpu"
    cuda_ok = want_cuda and torch.cuda.is_available()
    if request.startswith("cuda") and not cuda_ok:
        raise UsageError(f"{source} is {request} but CUDA is not available", fix)
    if not cuda_ok:
        reason = "device is cpu" if request == "cpu" else "no CUDA device"
        interp = os.environ.get("TRITON_INTERPRET", "") == "1"
        # Without the interpreter Triton cannot run on a CPU: do not even import it.
        triton_ok, why = _triton_importable() if interp else (False, None)
        reasons.update(dict.fromkeys(("pinned", "zero_copy", "graphs"), reason))
        if not triton_ok:
            reasons["triton"] = why or f"{reason} (set TRITON_INTERPRET=1 to run the kernels in the interpreter)"
        reasons["numa_node"] = f"{reason}: no GPU to place the cold bank next to"
        return DeviceInfo(torch.device("cpu"), "cpu", False, False, False, triton_ok, False, None, reasons)
    index = int(request.split(":")[1]) if ":" in request else 0
    if index >= torch.cuda.device_count():
        raise UsageError(f"{source} is cuda:{index} but only {torch.cuda.device_count()} GPU(s) are visible")
    dev = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(index)
    triton_ok, why = _triton_importable()
    # UVA is always on for 64-bit processes on every GPU that torch supports; pinned memory
    # allocated through cudaHostAlloc is then mapped at the same address on the device.
    if not triton_ok:
        reasons["triton"] = why  # _triton_importable always says why it failed
        reasons["graphs"] = "the torch fallback groups by expert on the host (not capturable)"
    node, node_why = _gpu_numa_node(index)
    if node_why:
        reasons["numa_node"] = node_why
    # Triton launches on the current device's current stream, and pinned memory is mapped for
    # the device current at allocation: make the chosen GPU current before anything is allocated.
    torch.cuda.set_device(dev)
    return DeviceInfo(dev, props.name, True, True, True, triton_ok, triton_ok, node, reasons)


def synchronizer(info: DeviceInfo) -> Callable[[], None]:
    """A callable that waits for the device's queued work (nothing to wait for on the CPU)."""
    if info.is_cuda:
        return lambda: torch.cuda.synchronize(info.device)
    return lambda: None


def clock_of(info: DeviceInfo) -> Clock:
    """The clock that times work on `info`'s device: CUDA events on a GPU, wall time on the CPU."""
    return cuda_event_clock(torch) if info.is_cuda else wall_clock


def tune_cpu_threads(info: DeviceInfo) -> None:
    """On the CPU path use one intra-op thread: the per-expert matmuls are far too small to
    split, and on a busy machine spinning worker threads make each op 10-50x slower."""
    if not info.is_cuda:
        torch.set_num_threads(1)
