"""sysfs readers on fake trees built in tmp_path: one node, two nodes, missing and odd link files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hotsplit_probes.sysfs import list_numa_nodes, read_numa_nodes, read_pci_link

from tests.fakes.machine import BDF, make_node, make_pci, write


def reasons_of(obj) -> dict[str, str]:
    return {r.field: r.why for r in obj.reasons}


def test_one_node(tmp_path):
    make_node(tmp_path, 0, "0-1", 5335244, 4399820, "10")
    nodes, reasons = read_numa_nodes(tmp_path)
    assert reasons == ()
    (n,) = nodes
    assert n.node == 0 and n.cpus == (0, 1) and n.distances == (10,)
    assert n.mem_total_bytes == 5335244 * 1024 and n.mem_free_bytes == 4399820 * 1024
    assert n.mem_used_bytes == (5335244 - 4399820) * 1024
    assert n.numastat["numa_miss"] == 7 and n.source == "sysfs"
    assert n.hugepages[0].size_kib == 2048 and n.hugepages[0].total == 0
    assert n.reasons == ()


def test_two_nodes(tmp_path):
    make_node(tmp_path, 0, "0-31,64-95", 100 << 20, 50 << 20, "10 21", huge_2m=(1024, 512))
    make_node(tmp_path, 1, "32-63,96-127", 100 << 20, 60 << 20, "21 10")
    nodes, _ = read_numa_nodes(tmp_path)
    assert [n.node for n in nodes] == [0, 1]
    assert nodes[1].cpus[:2] == (32, 33) and len(nodes[1].cpus) == 64
    assert nodes[0].distances == (10, 21) and nodes[1].distances == (21, 10)
    assert (nodes[0].hugepages[0].total, nodes[0].hugepages[0].free) == (1024, 512)
    assert list_numa_nodes(tmp_path) == (0, 1)


def test_no_numa_in_sysfs(tmp_path):
    nodes, reasons = read_numa_nodes(tmp_path)
    assert nodes == () and "kernel without NUMA" in reasons[0].why
    assert list_numa_nodes(tmp_path) is None


def test_node_with_missing_files_keeps_the_rest(tmp_path):
    write(tmp_path, "sys/devices/system/node/node0/cpulist", "0-3\n")
    (n,), _ = read_numa_nodes(tmp_path)
    assert n.cpus == (0, 1, 2, 3) and n.mem_total_bytes is None and n.numastat is None
    why = reasons_of(n)
    assert {"mem_total_bytes", "mem_free_bytes", "distances", "numastat"} <= set(why)


def test_pci_link_full(tmp_path):
    make_pci(tmp_path)
    link = read_pci_link("00000000:3B:00.0", tmp_path)  # NVML's form is accepted
    assert link.bdf == BDF and link.numa_node == 1 and link.local_cpus[0] == 32
    assert (link.current_gen, link.max_gen, link.current_width, link.max_width) == (4, 5, 16, 16)
    assert link.current_speed_gts == 16.0 and link.reasons == ()


def test_pci_link_numa_node_minus_one(tmp_path):
    make_pci(tmp_path, numa_node="-1")
    link = read_pci_link(BDF, tmp_path)
    assert link.numa_node is None
    assert "numa_node = -1" in reasons_of(link)["numa_node"]


def test_pci_link_unknown_speed(tmp_path):
    make_pci(tmp_path, cur_speed="Unknown", cur_width="255")
    link = read_pci_link(BDF, tmp_path)
    assert link.current_speed_gts is None and link.current_gen is None and link.current_width is None
    why = reasons_of(link)
    assert "'Unknown'" in why["current_speed_gts"] and "'255'" in why["current_width"]
    assert link.max_gen == 5


def test_pci_link_missing_link_files(tmp_path):
    make_pci(tmp_path, cur_speed=None, max_speed=None, cur_width=None, max_width=None, cpulist=None)
    link = read_pci_link(BDF, tmp_path)
    assert link.numa_node == 1
    assert link.current_gen is None and link.max_width is None and link.local_cpus is None
    assert set(reasons_of(link)) == {"current_speed_gts", "max_speed_gts", "current_width", "max_width",
                                     "local_cpus"}


def test_pci_device_absent(tmp_path):
    link = read_pci_link(BDF, tmp_path)
    assert link.numa_node is None and "does not exist" in reasons_of(link)["numa_node"]


@pytest.mark.skipif(not Path("/sys/devices/system/node").is_dir(), reason="needs Linux sysfs")
def test_real_sysfs_reads_without_error():
    nodes, reasons = read_numa_nodes("/")
    assert reasons == () and len(nodes) >= 1
    assert all(n.cpus is not None for n in nodes if n.mem_total_bytes)
