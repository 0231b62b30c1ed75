"""Linux sysfs: NUMA nodes (`/sys/devices/system/node/*`) and PCIe links (`/sys/bus/pci/devices/<bdf>`).

Every reader takes `root` (normally `/`) so tests run on a fake tree. Parsers are pure
`str -> value` functions. A file that is missing or unreadable gives None and a Reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .common import Reason, parse_cpulist, read_text

NODE_DIR = "sys/devices/system/node"
PCI_DIR = "sys/bus/pci/devices"

# PCIe signalling rate per generation (GT/s per lane) and the usable fraction after line
# encoding: 8b/10b for Gen1-2, 128b/130b for Gen3-5, and for Gen6 FLIT mode 242 payload bytes
# of 256 (PCI-SIG PCIe 6.0 base specification).
GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
GEN_EFFICIENCY = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


@dataclass(frozen=True)
class HugePages:
    size_kib: int
    total: int | None  # pages
    free: int | None
    surplus: int | None


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs, memory, distances, hugepages and allocation counters."""

    node: int
    cpus: tuple[int, ...] | None
    mem_total_bytes: int | None
    mem_free_bytes: int | None
    mem_used_bytes: int | None
    distances: tuple[int, ...] | None  # to node 0, 1, ... in the order of `nodes`
    hugepages: tuple[HugePages, ...]
    numastat: dict[str, int] | None  # numa_hit, numa_miss, ... in pages since boot
    source: str = "sysfs"  # "sysfs" | "numastat" (memory and counters)
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class PciLink:
    """A PCI device's NUMA node and link as sysfs reports them (the endpoint's side of the link)."""

    bdf: str  # sysfs form: 0000:3b:00.0
    numa_node: int | None
    local_cpus: tuple[int, ...] | None
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_gen: int | None
    max_gen: int | None
    current_width: int | None
    max_width: int | None
    reasons: tuple[Reason, ...] = ()


def parse_node_meminfo(text: str) -> dict[str, int]:
    """`Node 0 MemTotal:  5335244 kB` lines as {"MemTotal": bytes}; `HugePages_*` stay page counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*Node\s+\d+\s+([\w()]+):\s+(\d+)\s*(kB)?\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def parse_counters(text: str) -> dict[str, int]:
    """`name value` lines (a node's `numastat`, hugepage files) as a dict; other lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_link_speed(text: str) -> float | None:
    """`16.0 GT/s PCIe`, `8 GT/s`, `2.5 GT/s` -> GT/s; `Unknown` (or anything else) -> None."""
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s", text)
    return float(m.group(1)) if m else None


def speed_to_gen(gts: float | None) -> int | None:
    if gts is None:
        return None
    for gen, rate in GEN_GTS.items():
        if abs(rate - gts) < 0.01:
            return gen
    return None


def link_rate_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction payload rate of a PCIe link in GB/s (1e9 B/s), before protocol
    overhead (TLP headers cost a further ~5-15%). Gen4 x16 = 31.5, Gen5 x16 = 63.0."""
    if gen not in GEN_GTS or not width:
        return None
    return GEN_GTS[gen] * GEN_EFFICIENCY[gen] * width / 8


def sysfs_bdf(pci_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as sysfs's `0000:3b:00.0` (4-digit domain, lower case)."""
    text = pci_bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:
        return f"0000:{text}"
    return text


def _int_file(path: Path, reasons: list[Reason], field: str) -> int | None:
    text = read_text(path)
    if text is None:
        reasons.append(Reason(field, f"{path} is missing or unreadable"))
        return None
    try:
        return int(text.strip())
    except ValueError:
        reasons.append(Reason(field, f"{path} holds {text.strip()!r}, not a number"))
        return None


def read_pci_link(bdf: str, root: str | Path = "/") -> PciLink:
    """NUMA node, local CPUs and link speed/width of one PCI device (`bdf` in either form)."""
    bdf = sysfs_bdf(bdf)
    base = Path(root) / PCI_DIR / bdf
    reasons: list[Reason] = []
    if not base.is_dir():
        why = f"{base} does not exist"
        return PciLink(bdf, None, None, None, None, None, None, None, None,
                       tuple(Reason(f, why) for f in ("numa_node", "local_cpus", "current_speed_gts",
                                                      "max_speed_gts", "current_width", "max_width")))
    numa_node = _int_file(base / "numa_node", reasons, "numa_node")
    if numa_node is not None and numa_node < 0:
        reasons.append(Reason("numa_node", "firmware reports no NUMA affinity (numa_node = -1)"))
        numa_node = None
    cpulist = read_text(base / "local_cpulist")
    local_cpus = None
    if cpulist is None:
        reasons.append(Reason("local_cpus", f"{base / 'local_cpulist'} is missing or unreadable"))
    else:
        try:
            local_cpus = parse_cpulist(cpulist)
        except ValueError:
            reasons.append(Reason("local_cpus", f"local_cpulist holds {cpulist.strip()!r}"))
    speeds: dict[str, float | None] = {}
    for which in ("current", "max"):
        field = f"{which}_speed_gts"
        text = read_text(base / f"{which}_link_speed")
        speeds[which] = None if text is None else parse_link_speed(text)
        if text is None:
            reasons.append(Reason(field, f"{base}/{which}_link_speed is missing (no PCIe capability, or a VM)"))
        elif speeds[which] is None:
            reasons.append(Reason(field, f"{which}_link_speed reads {text.strip()!r}"))
    widths: dict[str, int | None] = {}
    for which in ("current", "max"):
        field = f"{which}_width"
        text = read_text(base / f"{which}_link_width")
        if text is None:
            reasons.append(Reason(field, f"{base}/{which}_link_width is missing (no PCIe capability, or a VM)"))
            widths[which] = None
            continue
        try:
            width = int(text.strip())
        except ValueError:
            width = 0
        # 0 or 255 mean the width could not be read (link down or not reported).
        widths[which] = width if 0 < width <= 32 else None
        if widths[which] is None:
            reasons.append(Reason(field, f"{which}_link_width reads {text.strip()!r}"))
    return PciLink(bdf, numa_node, local_cpus, speeds["current"], speeds["max"],
                   speed_to_gen(speeds["current"]), speed_to_gen(speeds["max"]),
                   widths["current"], widths["max"], tuple(reasons))


def read_hugepages(node_dir: Path) -> tuple[HugePages, ...]:
    out = []
    for d in sorted((node_dir / "hugepages").glob("hugepages-*kB")):
        m = re.match(r"hugepages-(\d+)kB$", d.name)
        if not m:
            continue

        def count(name: str, d: Path = d) -> int | None:
            text = read_text(d / name)
            return int(text) if text is not None and text.strip().isdigit() else None

        out.append(HugePages(int(m.group(1)), count("nr_hugepages"), count("free_hugepages"),
                             count("surplus_hugepages")))
    return tuple(sorted(out, key=lambda h: h.size_kib))


def read_numa_node(node: int, root: str | Path = "/") -> NumaNode:
    """One node from `/sys/devices/system/node/node<N>`."""
    d = Path(root) / NODE_DIR / f"node{node}"
    reasons: list[Reason] = []
    cpus = None
    text = read_text(d / "cpulist")
    if text is None:
        reasons.append(Reason("cpus", f"{d / 'cpulist'} is missing"))
    else:
        try:
            cpus = parse_cpulist(text)
        except ValueError:
            reasons.append(Reason("cpus", f"cpulist holds {text.strip()!r}"))
    meminfo_text = read_text(d / "meminfo")
    mem = parse_node_meminfo(meminfo_text) if meminfo_text is not None else {}
    for field, key in (("mem_total_bytes", "MemTotal"), ("mem_free_bytes", "MemFree"), ("mem_used_bytes", "MemUsed")):
        if key not in mem:
            reasons.append(Reason(field, f"{d / 'meminfo'} has no {key}"))
    distances = None
    text = read_text(d / "distance")
    if text is None:
        reasons.append(Reason("distances", f"{d / 'distance'} is missing"))
    else:
        try:
            distances = tuple(int(x) for x in text.split())
        except ValueError:
            reasons.append(Reason("distances", f"distance holds {text.strip()!r}"))
    stat_text = read_text(d / "numastat")
    counters = parse_counters(stat_text) if stat_text is not None else None
    if counters is None:
        reasons.append(Reason("numastat", f"{d / 'numastat'} is missing"))
    return NumaNode(node, cpus, mem.get("MemTotal"), mem.get("MemFree"), mem.get("MemUsed"), distances,
                    read_hugepages(d), counters, "sysfs", tuple(reasons))


def list_numa_nodes(root: str | Path = "/") -> tuple[int, ...] | None:
    """Node ids present under /sys/devices/system/node, or None when the kernel exposes no NUMA."""
    d = Path(root) / NODE_DIR
    if not d.is_dir():
        return None
    ids = [int(p.name[4:]) for p in d.glob("node*") if p.name[4:].isdigit()]
    return tuple(sorted(ids))


def read_numa_nodes(root: str | Path = "/") -> tuple[tuple[NumaNode, ...], tuple[Reason, ...]]:
    """Every NUMA node; on a kernel without NUMA in sysfs, no nodes and a reason."""
    ids = list_numa_nodes(root)
    if ids is None:
        return (), (Reason("numa_nodes", f"{Path(root) / NODE_DIR} does not exist (kernel without NUMA)"),)
    return tuple(read_numa_node(i, root) for i in ids), ()
