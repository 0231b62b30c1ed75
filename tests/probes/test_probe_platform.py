"""The assembled report on a fake two-socket, two-GPU machine (sysfs tree, NVML, CUDA and timings faked),
its platform.json document, the `hotsplit probe` rendering, and platform_file's reader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.core.errors import InputFileError
from probes.bandwidth import GpuBandwidth, HostCopyNode, NodeBandwidth, SweepPlan, summarize
from probes.common import DriverReport
from probes.cuda import CudaDevice, CudaReport, same_bus
from probes.host import HostInfo
from probes.hostmem import PageLocation
from probes.numastat import ToolOutput
from probes.nvml import LinkState, probe_nvml
from probes.platform import Sources, link_verdict, measure_platform, take_inventory
from tests.probes.test_probe_nvml import FakeNvml
from tests.probes.test_probe_sysfs import make_node, write

GIB = 1 << 30
NUMASTAT = Path(__file__).parents[1] / "data" / "numastat"


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


def fake_cpu_expert(shape, node, cpus, pool_bytes=None, samples=None, tick=None):
    """10 GB/s at one token, falling with more tokens (the CPU turns compute-bound)."""
    from probes.cpu_expert import CpuExpertRate

    CPU_EXPERT_CALLS.append((shape, node, cpus))
    tick(3)
    cells = tuple((t, summarize(shape.expert_bytes, 4, [10.0 / t ** 0.5] * 3)) for t in (1, 4, 16))
    return CpuExpertRate(node, cpus, len(cpus or ()) or 2, shape, shape.expert_bytes, 4, cells)


def fake_cuda() -> CudaReport:
    # CUDA enumerates the GPUs in the opposite order to the driver: matched by bus id.
    return CudaReport(True, "2.13.0", "12.8", (
        CudaDevice(0, "NVIDIA H100 80GB HBM3", "00000000:3b:00.0", 80 * GIB, 78 * GIB),
        CudaDevice(1, "NVIDIA H100 80GB HBM3", "00000000:19:00.0", 80 * GIB, 78 * GIB)), None)


def numastat_from_captures(args):
    name = "two-node-rhel78-m.txt" if args == ("-m",) else "two-node-rhel78.txt"
    return ToolOutput((NUMASTAT / name).read_text(), None)


@pytest.fixture
def gpu_sources(tmp_path) -> Sources:
    fake_tree(tmp_path)
    return Sources(root=tmp_path, nvml=lambda: probe_nvml(lambda: FakeNvml()),
                   nvidia_smi=lambda: pytest.fail("nvidia-smi must not run when NVML works"),
                   numastat=numastat_from_captures, cuda=fake_cuda, host=fake_host, host_copy=fake_host_copy,
                   gpu_bandwidth=fake_gpu_bandwidth, link_state=lambda bus: LinkState(4, 16), machine="x86_64",
                   cpu_expert=fake_cpu_expert)


def fields(doc) -> dict[str, str]:
    return {r["field"]: r["reason"] for r in doc["reasons"]}


def test_fake_gpu_machine_report(gpu_sources):
    inv = take_inventory("quick", 7 << 20, gpu_sources)
    assert inv.bind_nodes == (0, 1)
    ticks = []
    plat = measure_platform(inv, gpu_sources, tick=ticks.append, created="2026-01-01T00:00:00Z")
    assert sum(ticks) == inv.measurement_steps
    doc = plat.to_doc()
    assert list(doc)[:3] == ["schema", "created", "mode"] and doc["schema"] == "hotsplit.platform/1"
    assert {"host", "gpus", "reasons"} <= set(doc)
    host = doc["host"]
    assert host["numa_source"] == "numastat" and len(host["numa_nodes"]) == 2
    # numastat -m (MiB) overrides sysfs memory; distances still come from sysfs
    assert host["numa_nodes"][1]["mem_total_bytes"] == round(96732.40 * (1 << 20))
    assert host["numa_nodes"][0]["numastat"]["numa_hit"] == 4735090719
    assert host["numa_nodes"][1]["distances"] == [32, 10]
    g0, g1 = doc["gpus"]
    assert (g0["cuda_index"], g1["cuda_index"]) == (1, 0)
    assert (g0["numa_node"], g1["numa_node"], g0["numa_node_source"]) == (0, 1, "sysfs")
    assert g0["mem_free_bytes"] == 79 * GIB - (512 << 20)
    assert g0["pcie_gen_under_load"] == 4 and g0["link_verdict"] == "downtrained"
    assert g0["link_rate_gbps"] == pytest.approx(31.5, abs=0.1)
    assert g0["link_max_rate_gbps"] == pytest.approx(63.0, abs=0.1)
    s = g1["summary"]
    assert s["node"] == 1 and s["zero_copy_read_gbps"] == 40.0 and s["h2d_gbps"] == 50.0
    assert s["size_bytes"] == 256 << 20 and s["expert_size_bytes"] == 7 << 20
    assert s["zero_copy_read_expert_gbps"] == pytest.approx(40.0 * 7 / 64)
    local = next(n for n in g1["bandwidth"]["by_node"] if n["local"])
    assert local["zero_copy_read"][-1]["pct_of_link"] == pytest.approx(40.0 / 31.5, abs=0.01)
    assert "host.numa_source" not in fields(doc)
    # The CPU expert rate: once per GPU node, with that node's CPUs, for the recipe's expert shape.
    cpu = host["cpu_expert"]
    assert [c["node"] for c in cpu] == [0, 1] and cpu[1]["cpus"] == list(plat.host.numa_nodes[1].cpus)
    assert [t for t, _ in cpu[0]["by_tokens"]] == [1, 4, 16] and cpu[0]["by_tokens"][0][1]["median_gbps"] == 10.0
    assert plat.host.cpu_expert[0].gbps(2) == pytest.approx(10.0 - (10.0 - 5.0) / 3)  # between 1 and 4 tokens
    assert plat.host.cpu_expert[0].gbps(64) == pytest.approx(2.5)


def test_cpu_expert_rate_shape_comes_from_the_inventory(gpu_sources):
    from probes.cpu_expert import DEFAULT_SHAPE, ExpertShape

    CPU_EXPERT_CALLS.clear()
    measure_platform(take_inventory("quick", None, gpu_sources), gpu_sources)
    assert {c[0] for c in CPU_EXPERT_CALLS} == {DEFAULT_SHAPE}
    CPU_EXPERT_CALLS.clear()
    shape = ExpertShape(2048, 1408, "float16")
    measure_platform(take_inventory("quick", None, gpu_sources, shape), gpu_sources)
    assert {c[0] for c in CPU_EXPERT_CALLS} == {shape}


def test_a_failed_cpu_expert_rate_is_a_reason(gpu_sources):
    def broken(*a, tick=None, **kw):
        raise OSError("sched_setaffinity: Invalid argument")

    src = dataclasses.replace(gpu_sources, cpu_expert=broken)
    inv = take_inventory("quick", None, src)
    ticks = []
    doc = measure_platform(inv, src, tick=ticks.append).to_doc()
    assert doc["host"]["cpu_expert"] is None
    assert "sched_setaffinity" in fields(doc)["host.cpu_expert"]
    assert sum(ticks) == inv.measurement_steps  # the progress bar still ends


def test_verdicts():
    assert link_verdict(5, 16, 5, 16, 5)[0] == "ok"
    v, detail = link_verdict(3, 16, 4, 16, 4)
    assert v == "downtrained" and "Gen3 x16" in detail and "Gen4 x16" in detail
    assert link_verdict(4, 8, 4, 16, 4)[0] == "downtrained"
    v, detail = link_verdict(4, 16, 4, 16, 5)
    assert v == "host-limited" and "Gen5" in detail
    assert link_verdict(None, 16, 4, 16, 4)[0] == "unknown"


def test_nvml_missing_falls_back_to_nvidia_smi(gpu_sources):
    from probes.nvidia_smi import gpus_from_queries
    from tests.probes.test_probe_parsers import SMI_BASIC

    gpus, driver = gpus_from_queries(SMI_BASIC, {})
    src = dataclasses.replace(
        gpu_sources, nvml=lambda: DriverReport("nvml", False, None, (), "NVIDIA driver not loaded"),
        nvidia_smi=lambda: DriverReport("nvidia-smi", True, driver, gpus, None))
    doc = measure_platform(take_inventory("quick", None, src), src).to_doc()
    assert [g["source"] for g in doc["gpus"]] == ["nvidia-smi", "nvidia-smi"]
    assert "NVIDIA driver not loaded" in fields(doc)["gpus[*].source"]
    # No NVML: the link cannot be sampled under load; the verdict says unknown, with reasons.
    assert doc["gpus"][0]["link_verdict"] == "unknown"
    assert "gpus[0].pcie_gen_under_load" in fields(doc)
    assert doc["gpus"][0]["summary"]["h2d_gbps"] == 50.0


def test_cuda_unavailable_keeps_driver_fields(gpu_sources):
    src = dataclasses.replace(gpu_sources, cuda=lambda: CudaReport(False, "2.13.0+cpu", None, (),
                                                                  "torch 2.13.0+cpu is a CPU-only build (no CUDA)"))
    inv = take_inventory("quick", None, src)
    # host copies, and the CPU expert rate on each GPU node (the nodes are known without CUDA)
    assert inv.measurement_steps == 2 * len(inv.host_plan.sizes_bytes) + 2 * 3
    doc = measure_platform(inv, src).to_doc()
    g = doc["gpus"][0]
    assert g["bandwidth"] is None and g["summary"]["h2d_gbps"] is None and g["mem_total_bytes"] == 80 * GIB
    assert "CPU-only build" in fields(doc)["gpus[0].bandwidth"]
    assert "gpus[0].summary.zero_copy_read_gbps" in fields(doc)


def test_failed_measurement_is_a_reason(gpu_sources):
    def boom(*a, **k):
        raise RuntimeError("CUDA error: out of memory")

    src = dataclasses.replace(gpu_sources, gpu_bandwidth=boom)
    doc = measure_platform(take_inventory("quick", None, src), src).to_doc()
    assert "out of memory" in fields(doc)["gpus[0].bandwidth"]


def test_bad_numastat_output_falls_back_to_sysfs(gpu_sources):
    src = dataclasses.replace(gpu_sources, numastat=lambda args: ToolOutput("Token X not in hash table.\n", None))
    doc = measure_platform(take_inventory("quick", None, src), src).to_doc()
    assert doc["host"]["numa_source"] == "sysfs"
    assert "not understood" in fields(doc)["host.numa_source"]
    assert doc["host"]["numa_nodes"][0]["mem_total_bytes"] == (384 << 20) * 1024


def test_no_driver_skips_cuda(gpu_sources):
    src = dataclasses.replace(
        gpu_sources, nvml=lambda: DriverReport("nvml", False, None, (), "NVML library not found"),
        nvidia_smi=lambda: DriverReport("nvidia-smi", False, None, (), "nvidia-smi not found on PATH"),
        cuda=lambda: pytest.fail("CUDA must not be probed without a driver"))
    doc = measure_platform(take_inventory("quick", None, src), src).to_doc()
    assert doc["gpus"] == [] and "NVML library not found" in fields(doc)["gpus"]
    assert doc["host"]["copy_gbps"] == 20.0


def test_bus_ids_match_across_forms():
    assert same_bus("00000000:3B:00.0", "0000:3b:00.0")
    assert not same_bus("00000000:3B:00.0", "0000:3c:00.0")
    assert not same_bus(None, "0000:3b:00.0") and not same_bus("junk", "0000:3b:00.0")


# ----------------------------------------------------------------------------- the command with fakes


@pytest.fixture
def fake_machine(gpu_sources, monkeypatch):
    import hotsplit_cli.commands.probe as probe_cmd

    monkeypatch.setattr(probe_cmd, "_sources", lambda: gpu_sources)
    return gpu_sources


def test_cli_renders_gpu_tables_and_budget(cli, fake_machine, tmp_path):
    out = tmp_path / "platform.json"
    r = cli("probe", "--recipe", "tiny", "-o", out)
    assert r.code == 0, r.err
    for text in ("GPU memory", "PCIe links", "zero-copy read, GB/s", "host->device copy", "size sweep",
                 "hot budget", "downtrained", "NUMA nodes (from numastat)"):
        assert text in r.out, text
    assert "40.0*" in r.out  # local node marked in the GPU x node matrix
    # the host's "available" next to a smaller node "free" is explained right under the NUMA table
    lines = r.out.splitlines()
    legend = lines.index(next(x for x in lines if x.startswith("node free:")))
    assert "MemFree" in lines[legend] and "reclaim (MemAvailable)" in lines[legend]
    assert lines[legend - 1].split()[0] == "1"  # the last NUMA node row (the fake has nodes 0 and 1)
    assert f"wrote {out}" in r.err
    doc = json.loads(out.read_text())
    b = doc["gpus"][0]["hot_budget"]
    assert b["gpu_mem_gib"] == pytest.approx((79 * GIB - (512 << 20)) / GIB)
    assert b["hot_gib"] == pytest.approx(min(b["gpu_mem_gib"] - b["dense_gib"] - b["kv_cache_gib"] - b["reserve_gib"],
                                             b["bank_gib"]))
    assert doc["recipe"]["expert_bytes"] == 3 * 256 * 128 * 2
    assert list(doc)[-1] == "reasons"


def test_cli_json_and_platform_file_roundtrip(cli, fake_machine, tmp_path):
    out = tmp_path / "platform.json"
    r = cli("probe", "--json", "-o", out)
    assert r.code == 0 and r.err == f"wrote {out}\n"  # stdout holds the JSON document and nothing else
    assert json.loads(r.out) == json.loads(out.read_text())
    info = load_platform(out)
    assert [g.index for g in info.gpus] == [0, 1] and info.numa_nodes == 2
    g1 = info.gpu(1)
    assert g1.cuda_index == 0 and g1.zero_copy_read_gbps == 40.0 and g1.h2d_gbps == 50.0
    assert g1.mem_total_bytes == 80 * GIB and g1.numa_node == 1 and g1.link_rate_gbps == pytest.approx(31.5, 0.01)
    assert info.host_copy_gbps == 20.0
    with pytest.raises(InputFileError, match="no GPU 7"):
        info.gpu(7)


# ----------------------------------------------------------------------------- platform_file errors


def minimal_doc() -> dict:
    return {"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
            "host": {"numa_nodes": [{}], "copy_gbps": 9.5, "mem_available_bytes": 100},
            "gpus": [{"index": 0, "name": "g", "mem_free_bytes": 10, "mem_total_bytes": 20,
                      "summary": {"zero_copy_read_gbps": None, "h2d_gbps": 25.0}}],
            "reasons": [{"field": "gpus[0].summary.zero_copy_read_gbps", "reason": "no CUDA"}]}


def test_platform_file_minimal(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(minimal_doc()))
    info = load_platform(p)
    assert info.gpus[0].zero_copy_read_gbps is None and info.gpus[0].h2d_gbps == 25.0
    assert info.reasons == ("gpus[0].summary.zero_copy_read_gbps: no CUDA",)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="hotsplit.plan/1"), "is a hotsplit.plan file .* not a hotsplit.platform file"),
    (lambda d: d.pop("gpus"), "missing key 'gpus'"),
    (lambda d: d.update(gpus={}), "gpus: must be a list"),
    (lambda d: d["gpus"][0].update(mem_free_bytes=-1), r"gpus\[0\].mem_free_bytes: must be finite and >= 0"),
    (lambda d: d["gpus"][0].update(mem_free_bytes="10"), r"gpus\[0\].mem_free_bytes: must be an integer"),
    (lambda d: d["gpus"][0]["summary"].update(h2d_gbps=True), r"summary.h2d_gbps: must be a number"),
    (lambda d: d["gpus"][0].pop("index"), r"gpus\[0\].index: missing"),
    (lambda d: d["host"].update(numa_nodes=3), "numa_nodes: must be a list"),
    (lambda d: d.update(reasons=["x"]), r"reasons\[0\]"),
])
def test_platform_file_rejects_bad_files(tmp_path, edit, message):
    doc = minimal_doc()
    edit(doc)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputFileError, match=message):
        load_platform(p)


def test_platform_file_rejects_nan_and_truncation(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(minimal_doc())[:-20])
    with pytest.raises(InputFileError, match="not valid JSON"):
        load_platform(p)
    doc = minimal_doc()
    doc["host"]["copy_gbps"] = 1e400  # json.dumps writes Infinity, which orjson refuses as invalid JSON
    p.write_text(json.dumps(doc))
    with pytest.raises(InputFileError):
        load_platform(p)


def test_node_memory_that_does_not_add_up_to_memtotal_is_reported(gpu_sources):
    def why(src):
        return fields(measure_platform(take_inventory("quick", None, src), src).to_doc()).get("host.numa_nodes")

    sysfs = dataclasses.replace(gpu_sources, numastat=lambda args: ToolOutput(None, "numastat not found"))
    assert why(sysfs) is None  # two sysfs nodes of 384 GiB, MemTotal 768 GiB
    # A VM whose nodes show half of what /proc/meminfo says.
    half = dataclasses.replace(
        sysfs, host=lambda root: dataclasses.replace(fake_host(root), mem_total_bytes=1536 * GIB))
    assert why(half).startswith("the NUMA nodes hold 768.0 GiB but MemTotal is 1536.0 GiB")
    # The real numastat capture comes from a smaller machine than the fake host: said, not hidden.
    assert why(gpu_sources).startswith("the NUMA nodes hold 187.5 GiB but MemTotal is 768.0 GiB")
