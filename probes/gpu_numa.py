"""Which host NUMA node a GPU is closest to: one rule for the probe and the runtime.

The first source that answers decides:
1. sysfs: the PCI device's `numa_node` (-1 means the platform reports none, as on many VMs and
   on some H200 boxes);
2. NVML: `nvmlDeviceGetNumaNodeId`;
3. NVML memory affinity, when it names exactly one node;
4. the host's only NUMA node, when there is one.

The probe (`platform.py`) decides from what it has already read; the runtime
(`runtime/device.py`) asks `locate_gpu_numa_node` for the GPU it runs on, which reads the same
sources. Both therefore pin the cold bank on the same node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import GpuDevice
from .nvml import import_pynvml, probe_nvml
from .sysfs import NumaNode, PciLink, read_numa_nodes, read_pci_link, sysfs_bdf


@dataclass(frozen=True)
class GpuNumaNode:
    """The node (None when no source gives one), the source that gave it, and why not."""

    node: int | None
    source: str | None  # "sysfs" | "nvml" | "nvml memory affinity" | "only node"
    why_not: str | None = None  # set when node is None


def decide_gpu_numa_node(link: PciLink | None, gpu: GpuDevice | None, nodes: tuple[NumaNode, ...]) -> GpuNumaNode:
    """The rule above, from what was read: the GPU's sysfs link, its driver record and the host's nodes."""
    if link is not None and link.numa_node is not None:
        return GpuNumaNode(link.numa_node, "sysfs")
    if gpu is not None and gpu.numa_node is not None:
        return GpuNumaNode(gpu.numa_node, "nvml")
    if gpu is not None and gpu.memory_affinity and len(gpu.memory_affinity) == 1:
        return GpuNumaNode(gpu.memory_affinity[0], "nvml memory affinity")
    if len(nodes) == 1:
        return GpuNumaNode(nodes[0].node, "only node")
    why = "; ".join(r.why for r in (link.reasons if link else ()) if r.field == "numa_node") or "unknown"
    return GpuNumaNode(None, None, f"neither sysfs nor the driver gives it ({why})")


def locate_gpu_numa_node(pci_bus_id: str, root: str | Path = "/",
                         load_nvml: Callable[[], Any] = import_pynvml) -> GpuNumaNode:
    """The NUMA node of the GPU at `pci_bus_id` (either form: NVML's or sysfs's), read now."""
    bdf = sysfs_bdf(pci_bus_id)
    link = read_pci_link(bdf, root)
    driver = probe_nvml(load_nvml)
    gpu = next((g for g in driver.gpus if g.pci_bus_id and sysfs_bdf(g.pci_bus_id) == bdf), None)
    nodes, _ = read_numa_nodes(root)
    return decide_gpu_numa_node(link, gpu, nodes)
