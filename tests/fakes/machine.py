"""A fake two-socket, two-GPU H100 machine: a sysfs tree, NVML scenarios, CUDA and timings.

NVML is mocked as scenarios named after the failure they cover; the fakes reuse the real pynvml
error classes and constants (importable without a driver), so the probe's error handling is
exercised exactly as on a machine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from hotsplit_probes.bandwidth import GpuBandwidth, HostCopyNode, NodeBandwidth, SweepPlan, summarize
from hotsplit_probes.cuda import CudaDevice, CudaReport
from hotsplit_probes.host import HostInfo
from hotsplit_probes.hostmem import PageLocation
from hotsplit_probes.numastat import ToolOutput
from hotsplit_probes.nvml import LinkState, probe_nvml
from hotsplit_probes.platform import Sources

GIB = 1 << 30
NUMASTAT = Path(__file__).parents[1] / "data" / "numastat"
BDF = "0000:3b:00.0"


# ----------------------------------------------------------------------------- NVML


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """A healthy two-GPU H100 host; scenarios override single calls with `fail`."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_AFFINITY_SCOPE_NODE = pynvml.NVML_AFFINITY_SCOPE_NODE

    def __init__(self, fail: dict[str, int] | None = None, count: int = 2):
        self.fail = fail or {}
        self.count = count
        self.shutdowns = 0
        for const in dir(pynvml):
            if const.startswith("NVML_ERROR_"):
                setattr(self, const, getattr(pynvml, const))

    def _check(self, name: str, handle=None) -> None:
        key = name if handle is None else f"{name}:{handle}"
        for k in (key, name):
            if k in self.fail:
                raise err(self.fail[k])

    def nvmlInit(self):
        self._check("nvmlInit")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetCount(self):
        self._check("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check("nvmlDeviceGetHandleByIndex", i)
        return i

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return 0

    def nvmlDeviceGetName(self, h):
        self._check("nvmlDeviceGetName", h)
        return b"NVIDIA H100 80GB HBM3"  # older bindings return bytes

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h}"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x19 + h * 0x22:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version is not None:
            self._check("nvmlDeviceGetMemoryInfo_v2", h)
            return SimpleNamespace(total=80 * GIB, used=GIB, free=79 * GIB - (512 << 20), reserved=512 << 20)
        self._check("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=80 * GIB, used=GIB, free=79 * GIB)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        self._check("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return 1  # idle

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        self._check("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h):
        self._check("nvmlDeviceGetGpuMaxPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        self._check("nvmlDeviceGetCurrPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNumaNodeId(self, h):
        self._check("nvmlDeviceGetNumaNodeId", h)
        return h

    def nvmlDeviceGetCpuAffinity(self, h, words):
        self._check("nvmlDeviceGetCpuAffinity", h)
        return [0xFF << (8 * h)] + [0] * (words - 1)

    def nvmlDeviceGetMemoryAffinity(self, h, words, scope):
        self._check("nvmlDeviceGetMemoryAffinity", h)
        return [1 << h] + [0] * (words - 1)


# ----------------------------------------------------------------------------- sysfs


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def make_node(root: Path, node: int, cpus: str, total_kib: int, free_kib: int, distances: str,
              huge_2m: tuple[int, int] = (0, 0)) -> None:
    d = f"sys/devices/system/node/node{node}"
    write(root, f"{d}/cpulist", cpus + "\n")
    write(root, f"{d}/meminfo", f"Node {node} MemTotal:       {total_kib} kB\n"
                                f"Node {node} MemFree:        {free_kib} kB\n"
                                f"Node {node} MemUsed:        {total_kib - free_kib} kB\n"
                                f"Node {node} HugePages_Total:     {huge_2m[0]}\n")
    write(root, f"{d}/distance", distances + "\n")
    write(root, f"{d}/numastat", "numa_hit 100\nnuma_miss 7\nnuma_foreign 0\ninterleave_hit 1\nlocal_node 100\n"
                                 "other_node 7\n")
    h = f"{d}/hugepages/hugepages-2048kB"
    write(root, f"{h}/nr_hugepages", f"{huge_2m[0]}\n")
    write(root, f"{h}/free_hugepages", f"{huge_2m[1]}\n")
    write(root, f"{h}/surplus_hugepages", "0\n")


def make_pci(root: Path, numa_node: str = "1", cur_speed: str | None = "16.0 GT/s PCIe",
             max_speed: str | None = "32.0 GT/s PCIe", cur_width: str | None = "16", max_width: str | None = "16",
             cpulist: str | None = "32-63") -> None:
    d = f"sys/bus/pci/devices/{BDF}"
    write(root, f"{d}/numa_node", numa_node + "\n")
    for name, value in (("current_link_speed", cur_speed), ("max_link_speed", max_speed),
                        ("current_link_width", cur_width), ("max_link_width", max_width), ("local_cpulist", cpulist)):
        if value is not None:
            write(root, f"{d}/{name}", value + "\n")


# ----------------------------------------------------------------------------- the whole machine


def fake_host(root) -> HostInfo:
    return HostInfo("gpu-box", "6.8.0", "x86_64", "AMD EPYC 9654", 2, 192, 384, 768 * GIB, 700 * GIB)


def fake_tree(root: Path) -> None:
    make_node(root, 0, "0-95", 384 << 20, 300 << 20, "10 32")
    make_node(root, 1, "96-191", 384 << 20, 310 << 20, "32 10")
    for i, (bus, node) in enumerate((("0000:19:00.0", "0"), ("0000:3b:00.0", "1"))):
        d = f"sys/bus/pci/devices/{bus}"
        write(root, f"{d}/numa_node", node + "\n")
        write(root, f"{d}/local_cpulist", ("0-95" if i == 0 else "96-191") + "\n")


def fake_gpu_bandwidth(cuda_index, nodes, local_node, plan: SweepPlan, sample_link=None, tick=None):
    """Local reads at 50 GB/s copies / 40 GB/s zero-copy, remote at half; small sizes collapse."""
    link = sample_link() if sample_link else (None, None)
    by_node = []
    for node in nodes:
        scale = 1.0 if node == local_node else 0.5

        def sweep(peak, scale=scale):
            return tuple(summarize(s, plan.iterations(s), [peak * scale * min(1.0, s / (64 << 20))] * plan.samples)
                         for s in plan.sizes_bytes)

        tick(3 * len(plan.sizes_bytes))
        by_node.append(NodeBandwidth(node, node == local_node, PageLocation(node, {node: 1.0}, True), sweep(50.0),
                                     sweep(48.0), sweep(40.0)))
    return GpuBandwidth(cuda_index, "fake", tuple(by_node), link[0], link[1])


def fake_host_copy(nodes, plan, tick=None):
    tick(len(nodes) * len(plan.sizes_bytes))
    return tuple(HostCopyNode(n, PageLocation(n, {n: 1.0}, True),
                              tuple(summarize(s, 1, [20.0] * plan.samples) for s in plan.sizes_bytes)) for n in nodes)


CPU_EXPERT_CALLS = []


def fake_cpu_expert(shape, node, cpus, pool_bytes=None, samples=None, tick=None, threads=None, layer_experts=256):
    """10 GB/s at one token, falling with more tokens (the CPU turns compute-bound)."""
    from hotsplit_probes.cpu_expert import TOKENS, CpuExpertRate

    CPU_EXPERT_CALLS.append((shape, node, cpus))
    tick(len(TOKENS))
    cells = tuple((t, summarize(shape.expert_bytes, 4, [10.0 / t ** 0.5] * 3)) for t in (1, 4, 16))
    return CpuExpertRate(node, cpus, len(cpus or ()) or 2, shape, shape.expert_bytes, 4, cells)


def fake_gpu_compute(cuda_index, tick=None):
    """3000 GB/s of weights up to 64 tokens, compute-bound beyond (an H100's HBM3 and tensor cores)."""
    from hotsplit_probes.gpu_compute import TOKENS, GpuCompute

    tick(len(TOKENS))
    return GpuCompute("fake", "bfloat16", 128 << 20, tuple(
        (t, summarize(128 << 20, 20, [3000.0 * min(1.0, 64 / t)] * 7)) for t in TOKENS))


def fake_cuda() -> CudaReport:
    # CUDA enumerates the GPUs in the opposite order to the driver: matched by bus id.
    return CudaReport(True, "2.13.0", "12.8", (
        CudaDevice(0, "NVIDIA H100 80GB HBM3", "00000000:3b:00.0", 80 * GIB, 78 * GIB),
        CudaDevice(1, "NVIDIA H100 80GB HBM3", "00000000:19:00.0", 80 * GIB, 78 * GIB)), None)


def numastat_from_captures(args):
    name = "two-node-rhel78-m.txt" if args == ("-m",) else "two-node-rhel78.txt"
    return ToolOutput((NUMASTAT / name).read_text(), None)


def fake_gpu_sources(tmp_path: Path) -> Sources:
    """Every source of the probe faked: the sysfs tree under `tmp_path`, NVML, numastat
    captures, CUDA (enumerating the GPUs in the opposite order to the driver) and timings."""
    fake_tree(tmp_path)
    return Sources(root=tmp_path, nvml=lambda: probe_nvml(lambda: FakeNvml()),
                   nvidia_smi=lambda: pytest.fail("nvidia-smi must not run when NVML works"),
                   numastat=numastat_from_captures, cuda=fake_cuda, host=fake_host, host_copy=fake_host_copy,
                   gpu_bandwidth=fake_gpu_bandwidth, link_state=lambda bus: LinkState(4, 16), machine="x86_64",
                   cpu_expert=fake_cpu_expert, gpu_compute=fake_gpu_compute)
