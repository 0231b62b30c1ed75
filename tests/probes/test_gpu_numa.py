"""One GPU-to-NUMA-node rule: the probe's decision and the runtime's lookup agree, the H200 case
(sysfs says -1) included, on fake sysfs trees and a scenario NVML."""

from __future__ import annotations

import dataclasses

from hotsplit_probes.common import GpuDevice
from hotsplit_probes.gpu_numa import decide_gpu_numa_node, locate_gpu_numa_node
from hotsplit_probes.nvml import probe_nvml
from hotsplit_probes.sysfs import read_numa_nodes, read_pci_link

from tests.fakes.machine import FakeNvml, make_node, write

BUS_GPU1 = "00000000:3B:00.0"  # FakeNvml's second GPU (0x19 + 0x22)


def two_nodes(root, sysfs_node: str) -> None:
    make_node(root, 0, "0-3", 1 << 20, 1 << 19, "10 32")
    make_node(root, 1, "4-7", 1 << 20, 1 << 19, "32 10")
    write(root, "sys/bus/pci/devices/0000:3b:00.0/numa_node", sysfs_node + "\n")


def test_sysfs_decides_when_it_knows(tmp_path):
    two_nodes(tmp_path, "0")
    located = locate_gpu_numa_node(BUS_GPU1, tmp_path, lambda: FakeNvml())
    assert (located.node, located.source) == (0, "sysfs")  # NVML would say 1: sysfs comes first


def test_sysfs_minus_one_falls_back_to_nvml_in_probe_and_runtime_alike(tmp_path):
    two_nodes(tmp_path, "-1")  # the H200 machine: sysfs reports no affinity
    located = locate_gpu_numa_node(BUS_GPU1, tmp_path, lambda: FakeNvml())
    nodes, _ = read_numa_nodes(tmp_path)
    nvml_gpu = next(g for g in probe_nvml(FakeNvml).gpus if g.index == 1)
    probe_side = decide_gpu_numa_node(read_pci_link("0000:3b:00.0", tmp_path), nvml_gpu, nodes)
    assert (located.node, located.source) == (probe_side.node, probe_side.source) == (nvml_gpu.numa_node, "nvml")


def test_memory_affinity_then_the_only_node(tmp_path):
    gpu = GpuDevice.unreadable(0, "not asked", "nvml")
    gpu = dataclasses.replace(gpu, memory_affinity=(1,))
    assert decide_gpu_numa_node(None, gpu, ()).source == "nvml memory affinity"
    make_node(tmp_path, 0, "0-3", 1 << 20, 1 << 19, "10")
    nodes, _ = read_numa_nodes(tmp_path)
    only = decide_gpu_numa_node(None, None, nodes)
    assert (only.node, only.source, only.why_not) == (0, "only node", None)


def test_no_source_says_why(tmp_path):
    two_nodes(tmp_path, "-1")
    def no_nvml():
        raise ImportError("no pynvml")
    located = locate_gpu_numa_node(BUS_GPU1, tmp_path, no_nvml)
    assert located.node is None and located.source is None
    assert located.why_not.startswith("neither sysfs nor the driver gives it (")


def test_the_runtime_asks_this_rule_for_its_gpus_node(monkeypatch):
    """runtime/device.py passes torch's PCI address of the GPU to the same rule (on a GPU box)."""
    from types import SimpleNamespace

    import torch
    from hotsplit_probes.gpu_numa import GpuNumaNode
    from hotsplit_runtime import device

    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    asked = []
    monkeypatch.setattr(device, "locate_gpu_numa_node", lambda bus: asked.append(bus) or GpuNumaNode(1, "nvml"))
    assert device._gpu_numa_node(0) == (1, None) and asked == ["0000:3b:00.0"]
    monkeypatch.setattr(device, "locate_gpu_numa_node", lambda bus: GpuNumaNode(None, None, "neither ..."))
    assert device._gpu_numa_node(0) == (None, "neither ...")
