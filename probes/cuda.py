"""The GPUs torch can use (CUDA runtime view): index, name, PCI bus id, free/total memory.

CUDA's device order (and CUDA_VISIBLE_DEVICES) can differ from the driver's, so GPUs are
matched to NVML / nvidia-smi entries by PCI bus id. torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CudaDevice:
    cuda_index: int
    name: str
    pci_bus_id: str | None  # 00000000:3b:00.0 form, lower case
    mem_total_bytes: int
    mem_free_bytes: int | None


@dataclass(frozen=True)
class CudaReport:
    available: bool
    torch_version: str | None
    cuda_version: str | None
    devices: tuple[CudaDevice, ...]
    reason: str | None


def _import_torch() -> Any:
    import torch

    return torch


def list_cuda_devices(load: Callable[[], Any] = _import_torch) -> CudaReport:
    """Every CUDA device torch sees, or why it sees none (CPU build, no driver, no device)."""
    try:
        torch = load()
    except ImportError:
        return CudaReport(False, None, None, (), "torch is not installed")
    version = str(torch.__version__)
    cuda_version = getattr(torch.version, "cuda", None)
    if cuda_version is None:
        return CudaReport(False, version, None, (), f"torch {version} is a CPU-only build (no CUDA)")
    if not torch.cuda.is_available():
        return CudaReport(False, version, cuda_version, (), "CUDA is not available (no NVIDIA driver or no GPU)")
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        bus = None
        if hasattr(props, "pci_bus_id"):
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        try:
            free, _ = torch.cuda.mem_get_info(i)
        except RuntimeError:
            free = None
        devices.append(CudaDevice(i, props.name, bus, int(props.total_memory), None if free is None else int(free)))
    return CudaReport(True, version, cuda_version, tuple(devices), None)


def same_bus(a: str | None, b: str | None) -> bool:
    """PCI bus ids equal up to domain width and case (`00000000:3B:00.0` == `0000:3b:00.0`)."""
    if not a or not b:
        return False

    def norm(x: str) -> tuple[int, ...]:
        dom, bus, rest = x.strip().lower().split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)

    try:
        return norm(a) == norm(b)
    except ValueError:
        return False
