"""The platform report: every probe assembled into one `Platform`, and its platform.json document.

Two phases so a caller can show progress: `take_inventory` reads what the machine says about
itself (seconds at most, nothing timed), `measure_platform` times the copies and reads.
Sources are injectable (`Sources`) so tests replace NVML, nvidia-smi, numastat, CUDA and the
timed measurements with scenario fakes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .bandwidth import (
    GIB,
    GpuBandwidth,
    HostCopyNode,
    Measurement,
    SweepPlan,
    measure_gpu,
    measure_host_copy,
    sweep_plan,
    with_link,
)
from .common import DriverReport, GpuDevice, Reason, collect_reasons, to_doc
from .cpu_expert import (
    CPU_RUNTIME_DTYPE,
    CPU_RUNTIME_THREADS,
    DEFAULT_LAYER_EXPERTS,
    DEFAULT_SHAPE,
    QUICK_POOL_BYTES,
    TOKENS,
    CpuExpertRate,
    ExpertShape,
    measure_cpu_expert,
)
from .cuda import CudaReport, list_cuda_devices, same_bus
from .gpu_compute import TOKENS as COMPUTE_TOKENS
from .gpu_compute import GpuCompute, measure_gpu_compute
from .gpu_numa import decide_gpu_numa_node
from .host import HostInfo, probe_host
from .hostmem import SYS_MBIND
from .numastat import ToolOutput, parse_numastat, parse_numastat_table, run_numastat
from .nvidia_smi import probe_nvidia_smi
from .nvml import LinkState, probe_nvml, read_link_state
from .sysfs import NumaNode, PciLink, link_rate_gbps, read_numa_nodes, read_pci_link

SCHEMA = "hotsplit.platform/1"


@dataclass(frozen=True)
class Sources:
    """Where each probe reads from; tests swap any of them for a scenario fake."""

    root: Path = Path("/")
    nvml: Callable[[], DriverReport] = probe_nvml
    nvidia_smi: Callable[[], DriverReport] = probe_nvidia_smi
    numastat: Callable[[tuple[str, ...]], ToolOutput] = run_numastat
    cuda: Callable[[], CudaReport] = list_cuda_devices
    host: Callable[[Path], HostInfo] = probe_host
    host_copy: Callable[..., tuple[HostCopyNode, ...]] = measure_host_copy
    gpu_bandwidth: Callable[..., GpuBandwidth] = measure_gpu
    cpu_expert: Callable[..., CpuExpertRate] = measure_cpu_expert
    gpu_compute: Callable[..., GpuCompute] = measure_gpu_compute
    link_state: Callable[[str], LinkState] = read_link_state
    machine: str | None = None  # override platform.machine() (mbind support)


# ----------------------------------------------------------------------------- report dataclasses


@dataclass(frozen=True)
class Host:
    hostname: str
    kernel: str
    machine: str
    cpu_model: str | None
    cpu_sockets: int | None
    cpu_cores_physical: int | None
    cpu_cores_logical: int | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    numa_source: str  # "numastat" | "sysfs" | "none"
    numa_nodes: tuple[NumaNode, ...]
    copy_method: str
    copy: tuple[HostCopyNode, ...] | None  # memcpy sweep per source node
    copy_gbps: float | None  # best node's median at the largest size: what a CPU runtime reads at
    cpu_expert: tuple[CpuExpertRate, ...] | None  # CPU expert rate with each GPU node's threads
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class GpuSummary:
    """The figures `plan` uses: medians on the GPU's local node at the largest size swept."""

    node: int | None
    size_bytes: int | None
    h2d_gbps: float | None
    d2h_gbps: float | None
    zero_copy_read_gbps: float | None
    expert_size_bytes: int | None  # one real expert of --recipe, when given
    h2d_expert_gbps: float | None
    zero_copy_read_expert_gbps: float | None
    reasons: tuple[Reason, ...] = ()
    # (max - min) / median of the zero-copy read's samples at `size_bytes`: the band a time predicted
    # from it is judged with (absent from older files: readers take it as not recorded)
    zero_copy_read_spread: float | None = None


@dataclass(frozen=True)
class Gpu:
    index: int  # the driver's index (nvidia-smi order)
    cuda_index: int | None  # torch.cuda index (None: CUDA cannot use it)
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    numa_node: int | None
    numa_node_source: str | None  # "sysfs" | "nvml" | "nvml memory affinity" | "only node"
    cpu_affinity: tuple[int, ...] | None
    memory_affinity: tuple[int, ...] | None
    mem_total_bytes: int | None
    mem_free_bytes: int | None
    mem_used_bytes: int | None
    mem_reserved_bytes: int | None
    pcie_gen_current: int | None  # idle reading; see pcie_gen_under_load
    pcie_gen_max: int | None
    pcie_gen_gpu_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    pcie_gen_under_load: int | None
    pcie_width_under_load: int | None
    link_rate_gbps: float | None  # theoretical, at the generation/width the link runs under load
    link_max_rate_gbps: float | None  # theoretical, at the max generation/width of GPU and slot
    link_verdict: str  # "ok" | "downtrained" | "host-limited" | "unknown"
    link_detail: str | None
    source: str  # "nvml" | "nvidia-smi"
    bandwidth: GpuBandwidth | None
    summary: GpuSummary
    reasons: tuple[Reason, ...] = ()
    compute: GpuCompute | None = None  # its compute rate through resident weights (prefetch's hiding room)


@dataclass(frozen=True)
class Platform:
    created: str
    mode: str  # quick | full
    host: Host
    gpus: tuple[Gpu, ...]
    driver_version: str | None
    cuda: dict[str, Any]  # torch / CUDA runtime versions
    reasons: tuple[Reason, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """The platform.json document (`hotsplit.platform/1`)."""
        doc = {"schema": SCHEMA, "created": self.created, "mode": self.mode}
        doc.update({k: v for k, v in to_doc(self).items() if k not in ("created", "mode")})
        doc["reasons"] = collect_reasons(self)
        return doc


# ----------------------------------------------------------------------------- pure pieces


def link_verdict(gen: int | None, width: int | None, gen_max: int | None, width_max: int | None,
                 gen_gpu_max: int | None) -> tuple[str, str | None]:
    """Is the link running below what GPU and slot allow? (gen, width) must be read under load:
    idle links drop to Gen1 to save power and would read as downtrained."""
    if gen is None or width is None or gen_max is None or width_max is None:
        return "unknown", "link generation/width under load or its maximum could not be read"
    if gen < gen_max or width < width_max:
        return "downtrained", (f"runs Gen{gen} x{width} under load; GPU and slot allow Gen{gen_max} x{width_max} "
                               "(reseat the card, check the slot's lanes and BIOS PCIe settings)")
    if gen_gpu_max is not None and gen_gpu_max > gen_max:
        return "host-limited", f"GPU supports Gen{gen_gpu_max} but the slot/host caps the link at Gen{gen_max}"
    return "ok", f"Gen{gen} x{width}"


def _at_size(cells: tuple[Measurement, ...] | None, size: int | None) -> float | None:
    if not cells or size is None:
        return None
    for m in cells:
        if m.size_bytes == size:
            return m.median_gbps
    return None


def _relative_spread(cells: tuple[Measurement, ...] | None, size: int | None) -> float | None:
    """(max - min) / median of the samples at `size` (None: not measured there)."""
    m = next((m for m in cells or () if m.size_bytes == size), None)
    return m.spread_gbps / m.median_gbps if m is not None and m.median_gbps > 0 else None


def summarize_gpu(bw: GpuBandwidth | None, local_node: int | None, expert_bytes: int | None) -> GpuSummary:
    """Pick the local node (else the node with the best zero-copy read) at the largest size."""
    if bw is None or not bw.by_node:
        why = "no bandwidth measured for this GPU"
        return GpuSummary(None, None, None, None, None, None, None, None,
                          tuple(Reason(k, why) for k in ("h2d_gbps", "d2h_gbps", "zero_copy_read_gbps")))
    measured = [n for n in bw.by_node if n.h2d]
    if not measured:
        why = "every node's measurement failed (see bandwidth.by_node)"
        return GpuSummary(None, None, None, None, None, None, None, None,
                          tuple(Reason(k, why) for k in ("h2d_gbps", "d2h_gbps", "zero_copy_read_gbps")))
    local = [n for n in measured if n.node == local_node and local_node is not None]
    if local:
        pick = local[0]
    else:
        pick = max(measured, key=lambda n: (n.zero_copy_read or n.h2d)[-1].median_gbps)
    size = max(m.size_bytes for m in pick.h2d)
    reasons = []
    zc = _at_size(pick.zero_copy_read, size)
    if zc is None:
        reasons.append(Reason("zero_copy_read_gbps", "zero-copy read not measured (see bandwidth.by_node)"))
    exp = None if expert_bytes is None else expert_bytes - expert_bytes % 4
    if exp is None:
        reasons.append(Reason("expert_size_bytes", "no --recipe given"))
    return GpuSummary(pick.node, size, _at_size(pick.h2d, size), _at_size(pick.d2h, size), zc, exp,
                      _at_size(pick.h2d, exp), _at_size(pick.zero_copy_read, exp), tuple(reasons),
                      _relative_spread(pick.zero_copy_read, size))


def _with_link_pct(bw: GpuBandwidth, rate: float | None) -> GpuBandwidth:
    def pct(cells):
        return None if cells is None else tuple(with_link(m, rate) for m in cells)

    nodes = tuple(dataclasses.replace(n, h2d=pct(n.h2d), d2h=pct(n.d2h), zero_copy_read=pct(n.zero_copy_read))
                  for n in bw.by_node)
    return dataclasses.replace(bw, by_node=nodes)


def apply_numastat(nodes: tuple[NumaNode, ...], memory_text: str, counters_text: str) -> tuple[NumaNode, ...]:
    """Overlay `numastat -m` memory (MiB) and plain `numastat` counters (pages) on sysfs nodes.
    Raises ValueError when the text does not parse or names other nodes."""
    mem = parse_numastat_table(memory_text)
    counts = parse_numastat(counters_text)
    out = []
    for n in nodes:
        if n.node not in mem.nodes or n.node not in counts.nodes:
            raise ValueError(f"numastat does not list node {n.node}")
        out.append(dataclasses.replace(
            n, mem_total_bytes=mem.bytes_of("MemTotal", n.node), mem_free_bytes=mem.bytes_of("MemFree", n.node),
            mem_used_bytes=mem.bytes_of("MemUsed", n.node), numastat=counts.of_node(n.node), source="numastat",
            reasons=tuple(r for r in n.reasons if not r.field.startswith(("mem_", "numastat")))))
    return tuple(out)


# ----------------------------------------------------------------------------- phase 1: inventory


@dataclass(frozen=True)
class Inventory:
    """What the machine says about itself, and the plan for what to time."""

    mode: str
    expert_bytes: int | None
    host: HostInfo
    numa_nodes: tuple[NumaNode, ...]
    numa_source: str
    driver: DriverReport | None
    cuda: CudaReport | None
    links: dict[int, PciLink]  # driver GPU index -> sysfs link
    host_plan: SweepPlan
    gpu_plan: SweepPlan
    bind_nodes: tuple[int | None, ...]  # host buffer placements to time
    expert_shape: ExpertShape = DEFAULT_SHAPE  # what the CPU expert rate computes
    layer_experts: int = DEFAULT_LAYER_EXPERTS  # routed experts per layer, for the cost of a layer's call
    reasons: tuple[Reason, ...] = field(default=())  # JSON paths from the top of platform.json

    @property
    def gpu_count_to_measure(self) -> int:
        if self.cuda is None or not self.cuda.available or self.driver is None:
            return 0
        return sum(1 for g in self.driver.gpus if _cuda_match(g, self.cuda) is not None)

    @property
    def measurement_steps(self) -> int:
        """Progress units: one per (node, size) host copy, three per (GPU, node, size), one per
        (GPU, token count) of its compute rate, one per token count of the CPU expert rate (once
        per GPU node at most)."""
        host = len(self.bind_nodes) * len(self.host_plan.sizes_bytes)
        per_gpu = 3 * len(self.bind_nodes) * len(self.gpu_plan.sizes_bytes) + len(COMPUTE_TOKENS)
        gpu = self.gpu_count_to_measure * per_gpu
        return host + gpu + len(TOKENS) * max(1, len(self.gpu_nodes))

    @property
    def gpu_nodes(self) -> list[int]:
        """The NUMA nodes of the GPUs, each once: where the CPU expert rate is measured."""
        gpus = self.driver.gpus if self.driver else ()
        nodes = {decide_gpu_numa_node(self.links.get(g.index), g, self.numa_nodes).node for g in gpus}
        return sorted(n for n in nodes if n is not None)


def _cuda_match(gpu: GpuDevice, cuda: CudaReport) -> int | None:
    for d in cuda.devices:
        if same_bus(d.pci_bus_id, gpu.pci_bus_id):
            return d.cuda_index
    # A torch build without PCI ids in device properties: fall back to order when counts agree.
    if len(cuda.devices) and all(d.pci_bus_id is None for d in cuda.devices) and gpu.index < len(cuda.devices):
        return gpu.index
    return None


NODE_MEMORY_TOLERANCE = 0.05  # firmware and kernel reservations make the two differ by a few percent


def _node_memory_mismatch(nodes: tuple[NumaNode, ...], mem_total_bytes: int | None) -> str | None:
    """Say so when the NUMA nodes' memory does not add up to MemTotal: a VM or container can
    show per-node counters of another extent than /proc/meminfo, and neither is then the whole truth."""
    per_node = [n.mem_total_bytes for n in nodes]
    if not per_node or None in per_node or not mem_total_bytes:
        return None
    total = sum(per_node)
    if abs(total - mem_total_bytes) <= NODE_MEMORY_TOLERANCE * mem_total_bytes:
        return None
    return (f"the NUMA nodes hold {total / GIB:.1f} GiB but MemTotal is {mem_total_bytes / GIB:.1f} GiB: "
            "the per-node and the global view of memory disagree (a VM or container?)")


def _numastat_nodes(nodes: list, sources: Sources, reasons: list[Reason]) -> tuple[list, str]:
    """The sysfs nodes with numastat's per-node memory and counters where numastat runs."""
    numa_source = "sysfs" if nodes else "none"
    if nodes:
        mem_out, cnt_out = sources.numastat(("-m",)), sources.numastat(())
        if mem_out.text is None or cnt_out.text is None:
            why = mem_out.reason or cnt_out.reason
            reasons.append(Reason("host.numa_source", f"{why}; per-node memory and counters read from sysfs"))
        else:
            try:
                nodes = apply_numastat(nodes, mem_out.text, cnt_out.text)
                numa_source = "numastat"
            except ValueError as exc:
                reasons.append(Reason("host.numa_source", f"numastat output not understood ({exc}); read sysfs"))
    return nodes, numa_source


def _gpu_driver(sources: Sources, reasons: list[Reason]):
    """NVML, else nvidia-smi, else None (no GPU), saying why."""
    driver = sources.nvml()
    if not driver.available:
        smi = sources.nvidia_smi()
        if smi.available:
            reasons.append(Reason("gpus[*].source", f"NVML unavailable ({driver.reason}); fields from nvidia-smi"))
            driver = smi
        else:
            reasons.append(Reason("gpus", f"no GPU: NVML: {driver.reason}; nvidia-smi: {smi.reason}"))
            return None
    return driver


def take_inventory(mode: str = "quick", expert_bytes: int | None = None, sources: Sources = Sources(),
                   expert_shape: ExpertShape | None = None, layer_experts: int | None = None) -> Inventory:
    """Host, NUMA nodes, GPUs and links: read, not timed. `expert_shape`: the expert the CPU
    expert rate computes, `layer_experts` the routed experts per layer (a recipe's; DeepSeek-V3's
    when None)."""
    import platform as _platform

    reasons: list[Reason] = []
    host = sources.host(sources.root)
    nodes, node_reasons = read_numa_nodes(sources.root)
    reasons.extend(Reason(f"host.{r.field}", r.why) for r in node_reasons)
    nodes, numa_source = _numastat_nodes(nodes, sources, reasons)
    mismatch = _node_memory_mismatch(nodes, host.mem_total_bytes)
    if mismatch:
        reasons.append(Reason("host.numa_nodes", mismatch))

    driver = _gpu_driver(sources, reasons)
    # Without a driver CUDA cannot work either: skip importing torch.
    cuda = sources.cuda() if driver is not None else None
    links = {g.index: read_pci_link(g.pci_bus_id, sources.root) for g in (driver.gpus if driver else ())
             if g.pci_bus_id}

    machine = sources.machine or _platform.machine()
    memory_nodes = tuple(n.node for n in nodes if (n.mem_total_bytes or 0) > 0)
    if machine not in SYS_MBIND:
        bind_nodes: tuple[int | None, ...] = (None,)
        reasons.append(Reason("host.copy", f"cannot place buffers on NUMA nodes on {machine}: measured unbound"))
    elif not memory_nodes:
        bind_nodes = (None,)
    else:
        bind_nodes = memory_nodes
    extra = (expert_bytes,) if expert_bytes else ()
    host_plan = sweep_plan(mode, "host", extra)
    if host.mem_available_bytes:
        # Source and destination buffers must fit with room to spare.
        fitted = host_plan.limited_to(host.mem_available_bytes // 4)
        if len(fitted.sizes_bytes) < len(host_plan.sizes_bytes):
            reasons.append(Reason("host.copy", "largest sizes skipped: they need more than a quarter of "
                                               "the available RAM"))
        host_plan = fitted
    return Inventory(mode, expert_bytes, host, nodes, numa_source, driver, cuda, links, host_plan,
                     sweep_plan(mode, "gpu", extra), bind_nodes, expert_shape or DEFAULT_SHAPE,
                     layer_experts or DEFAULT_LAYER_EXPERTS, tuple(reasons))


# ----------------------------------------------------------------------------- phase 2: measure


def _build_gpu(inv: Inventory, g: GpuDevice, sources: Sources, tick: Callable[[int], None]) -> Gpu:
    link = inv.links.get(g.index)
    reasons = list(g.reasons)
    located = decide_gpu_numa_node(link, g, inv.numa_nodes)
    node, node_source = located.node, located.source
    reasons = [r for r in reasons if r.field != "numa_node"]
    if node is None:
        reasons.append(Reason("numa_node", located.why_not))
    cuda_index = _cuda_match(g, inv.cuda) if inv.cuda is not None else None
    bw = None
    if cuda_index is None:
        why = inv.cuda.reason if inv.cuda is not None and inv.cuda.reason else "CUDA (torch) cannot see this GPU"
        reasons.append(Reason("bandwidth", why))
        reasons.append(Reason("cuda_index", why))
    else:
        sample = (lambda: sources.link_state(g.pci_bus_id)) if g.source == "nvml" and g.pci_bus_id else None
        try:
            bw = sources.gpu_bandwidth(cuda_index, inv.bind_nodes, node, inv.gpu_plan, sample, tick)
        except Exception as exc:  # noqa: BLE001 - a failed measurement is a reason, not a lost report
            reasons.append(Reason("bandwidth", f"measurement failed: {type(exc).__name__}: {exc}"))
    compute = _measure_compute(cuda_index, sources, tick, reasons)
    gen_load = bw.link_gen_under_load if bw else None
    width_load = bw.link_width_under_load if bw else None
    if gen_load is None:
        reasons.append(Reason("pcie_gen_under_load", "not sampled (no CUDA measurement or no NVML)"))
    if width_load is None:
        reasons.append(Reason("pcie_width_under_load", "not sampled (no CUDA measurement or no NVML)"))
    rate = link_rate_gbps(gen_load, width_load) or link_rate_gbps(g.pcie_gen_max, g.pcie_width_max)
    max_rate = link_rate_gbps(g.pcie_gen_max, g.pcie_width_max)
    if rate is None:
        reasons.append(Reason("link_rate_gbps", "PCIe generation/width unknown"))
    if max_rate is None:
        reasons.append(Reason("link_max_rate_gbps", "PCIe max generation/width unknown"))
    verdict, detail = link_verdict(gen_load, width_load, g.pcie_gen_max, g.pcie_width_max, g.pcie_gen_gpu_max)
    if bw is not None:
        bw = _with_link_pct(bw, rate)
    summary = summarize_gpu(bw, node, inv.expert_bytes)
    return Gpu(g.index, cuda_index, g.name, g.uuid, g.pci_bus_id, node, node_source, g.cpu_affinity,
               g.memory_affinity, g.mem_total_bytes, g.mem_free_bytes, g.mem_used_bytes, g.mem_reserved_bytes,
               g.pcie_gen_current, g.pcie_gen_max, g.pcie_gen_gpu_max, g.pcie_width_current, g.pcie_width_max,
               gen_load, width_load, rate, max_rate, verdict, detail, g.source, bw, summary, tuple(reasons), compute)


def _measure_compute(cuda_index: int | None, sources: Sources, tick: Callable[[int], None],
                     reasons: list[Reason]) -> GpuCompute | None:
    """The GPU's compute rate (gpu_compute.py), or None with the reason why not."""
    if cuda_index is None:
        reasons.append(Reason("compute", "CUDA (torch) cannot see this GPU"))
        return None
    try:
        return sources.gpu_compute(cuda_index, tick)
    except Exception as exc:  # noqa: BLE001 - a failed measurement is a reason, not a lost report
        reasons.append(Reason("compute", f"measurement failed: {type(exc).__name__}: {exc}"))
        tick(len(COMPUTE_TOKENS))
        return None


def _measure_cpu_expert(inv: Inventory, gpus: tuple, sources: Sources, tick: Callable[[int], None],
                        reasons: list[Reason]) -> tuple[CpuExpertRate, ...] | None:
    """The CPU expert rate with the threads and memory of each GPU's NUMA node (the cold bank's);
    unbound when no GPU's node is known."""
    nodes = inv.gpu_nodes
    shape = inv.expert_shape
    if not nodes:
        why = "no GPU" if not gpus else "the GPUs' NUMA node is unknown"
        reasons.append(Reason("cpu_expert[*].node", f"{why}: measured with every CPU and unplaced memory"))
    cpus_of = {n.node: n.cpus for n in inv.numa_nodes}
    pool = QUICK_POOL_BYTES if inv.mode == "quick" else None
    extra: dict[str, Any] = {"layer_experts": inv.layer_experts}
    if not gpus:
        # Without a GPU the runtime computes every expert on this CPU in float32 with one torch
        # thread (runtime/device.py tune_cpu_threads): measure that, so a run can use the figures.
        shape = ExpertShape(shape.hidden, shape.inter, CPU_RUNTIME_DTYPE)
        extra["threads"] = CPU_RUNTIME_THREADS
        reasons.append(Reason("cpu_expert[*].shape", f"no GPU: measured in {CPU_RUNTIME_DTYPE} with "
                                                     f"{CPU_RUNTIME_THREADS} thread, as the CPU runtime computes"))
    out = []
    for node in nodes or [None]:
        kwargs = {"tick": tick, **extra} if pool is None else {"tick": tick, "pool_bytes": pool, "samples": 3, **extra}
        try:
            out.append(sources.cpu_expert(shape, node, cpus_of.get(node), **kwargs))
        except Exception as exc:  # noqa: BLE001 - a failed measurement is a reason, not a lost report
            reasons.append(Reason("cpu_expert", f"CPU expert rate not measured: {type(exc).__name__}: {exc}"))
            tick(len(TOKENS) * (len(nodes or [None]) - len(out)))
            return None
    return tuple(out)


def measure_platform(inv: Inventory, sources: Sources = Sources(), tick: Callable[[int], None] | None = None,
                     created: str | None = None) -> Platform:
    """Time host copies and every CUDA-visible GPU; assemble the report."""
    tick = tick or (lambda n: None)
    reasons = list(inv.reasons)
    host_reasons = list(inv.host.reasons)
    copy = None
    copy_gbps = None
    try:
        copy = sources.host_copy(inv.bind_nodes, inv.host_plan, tick)
        copy_gbps = max(c.copy[-1].median_gbps for c in copy) if copy else None
    except Exception as exc:  # noqa: BLE001 - a failed measurement is a reason, not a lost report
        host_reasons.append(Reason("copy", f"host copy measurement failed: {type(exc).__name__}: {exc}"))
    if copy_gbps is None:
        host_reasons.append(Reason("copy_gbps", "host copy bandwidth not measured"))
    gpus = tuple(_build_gpu(inv, g, sources, tick) for g in (inv.driver.gpus if inv.driver else ()))
    cpu_expert = _measure_cpu_expert(inv, gpus, sources, tick, host_reasons)
    info = {f.name: getattr(inv.host, f.name) for f in dataclasses.fields(HostInfo) if f.name != "reasons"}
    host = Host(**info, numa_source=inv.numa_source, numa_nodes=inv.numa_nodes,
                copy_method="numpy.copyto between page-aligned buffers, source placed on each node; wall clock",
                copy=copy, copy_gbps=copy_gbps, cpu_expert=cpu_expert, reasons=tuple(host_reasons))
    if inv.driver is not None and inv.cuda is not None and not inv.cuda.available:
        reasons.append(Reason("gpus[*].bandwidth", inv.cuda.reason or "CUDA unavailable"))
    cuda = {"torch": inv.cuda.torch_version if inv.cuda else None,
            "cuda_runtime": inv.cuda.cuda_version if inv.cuda else None}
    created = created or datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return Platform(created, inv.mode, host, gpus, inv.driver.driver_version if inv.driver else None, cuda,
                    tuple(reasons))
