"""Pure parsers of tool output, checked on real captured text (tests/data/numastat/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hotsplit_probes.bandwidth import SweepPlan, summarize, sweep_plan
from hotsplit_probes.common import collect_reasons, mask_to_ids, parse_cpulist
from hotsplit_probes.host import count_sockets, parse_cpu_model, parse_meminfo
from hotsplit_probes.numastat import parse_numastat, parse_numastat_table, run_numastat
from hotsplit_probes.nvidia_smi import BASIC_FIELDS, gpus_from_queries, parse_query_csv, probe_nvidia_smi
from hotsplit_probes.sysfs import link_rate_gbps, parse_link_speed, parse_node_meminfo, speed_to_gen, sysfs_bdf

DATA = Path(__file__).parents[1] / "data" / "numastat"


def sections(path: Path) -> dict[str, str]:
    """A capture of several commands, split on its `$ command` lines."""
    out: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("$ "):
            current = line[2:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


VM = sections(DATA / "single-node-vm.txt")


# ----------------------------------------------------------------------------- numastat


def test_plain_numastat_single_node():
    c = parse_numastat(VM["numastat"])
    assert c.nodes == (0,)
    assert c.counters["numa_hit"] == (1629781,)
    assert c.counters["interleave_hit"] == (1136,)
    assert c.of_node(0)["other_node"] == 0
    assert list(c.counters) == ["numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node"]


def test_plain_numastat_two_nodes():
    c = parse_numastat((DATA / "two-node-rhel78.txt").read_text())
    assert c.nodes == (0, 1)
    assert c.counters["numa_hit"] == (4735090719, 2770141501)
    assert c.counters["numa_miss"] == (0, 92981)
    assert c.of_node(1)["other_node"] == 690808


def test_plain_numastat_wide_machine_prints_column_groups():
    text = ("                           node0           node1\nnuma_hit   10   20\nnuma_miss  1  2\n"
            "                           node2\nnuma_hit   30\nnuma_miss  3\n")
    c = parse_numastat(text)
    assert c.nodes == (0, 1, 2)
    assert c.counters["numa_hit"] == (10, 20, 30) and c.counters["numa_miss"] == (1, 2, 3)


def test_numastat_m_skips_token_junk_lines():
    t = parse_numastat_table(VM["numastat -m"])
    assert t.title == "Per-node system memory usage (in MBs):"
    assert t.nodes == (0,)
    assert len(t.skipped) == 4 and all(s.startswith("Token ") for s in t.skipped)
    assert t.rows["MemTotal"] == (5081.78,) and t.totals["MemTotal"] == 5081.78
    assert t.rows["Active(anon)"] == (1.52,)
    assert t.rows["KReclaimable"] == (85.51,)
    assert t.bytes_of("MemFree", 0) == round(3174.16 * (1 << 20))
    assert t.bytes_of("MemFree", 5) is None and t.bytes_of("Nope", 0) is None
    assert "SwapCached" not in t.rows


def test_numastat_m_two_nodes_with_hugepages():
    t = parse_numastat_table((DATA / "two-node-rhel78-m.txt").read_text())
    assert t.nodes == (0, 1)
    assert t.rows["MemTotal"] == (95257.24, 96732.40)
    assert t.totals["MemTotal"] == 191989.64
    assert t.rows["HugePages_Total"] == (56320.00, 56320.00)
    assert t.rows["HugePages_Free"] == (52224.00, 52224.00)
    assert t.skipped == ()


def test_numastat_n_and_compact_forms():
    n = parse_numastat_table(VM["numastat -n"])
    assert n.title == "Per-node numastat info (in MBs):"
    assert n.rows["Numa_Hit"] == (6367.66,) and n.rows["Interleave_Hit"] == (4.44,)
    c = parse_numastat_table(VM["numastat -c"])
    assert c.rows["Numa_Hit"] == (6367.0,) and c.totals["Numa_Hit"] == 6367.0
    cm = parse_numastat_table(VM["numastat -cm"])
    assert cm.rows["MemTotal"] == (5082.0,) and len(cm.skipped) == 4


@pytest.mark.parametrize("text", ["", "numa_hit 5\n", "   node0\nnuma_hit x\n", "   node0 node1\nnuma_hit 1\n"])
def test_plain_numastat_rejects_malformed_text(text):
    with pytest.raises(ValueError):
        parse_numastat(text)


@pytest.mark.parametrize("text", ["", "MemTotal 5.0 5.0\n", "   Node 0 Total\nMemTotal 5.0\n"])
def test_numastat_table_rejects_malformed_text(text):
    with pytest.raises(ValueError):
        parse_numastat_table(text)


class _Proc:
    def __init__(self, rc, out="", err=""):
        self.returncode, self.stdout, self.stderr = rc, out, err


def test_run_numastat_without_binary_says_why():
    r = run_numastat(("-m",), which=lambda name: None)
    assert r.text is None and "numactl" in r.reason


def test_run_numastat_reports_failures_and_passes_output():
    r = run_numastat(("-m",), which=lambda n: "/usr/bin/numastat", run=lambda argv: _Proc(1, err="boom\n"))
    assert r.text is None and "exited 1: boom" in r.reason
    seen = []
    r = run_numastat(("-m",), which=lambda n: "/usr/bin/numastat",
                     run=lambda argv: seen.append(argv) or _Proc(0, out=VM["numastat -m"]))
    assert seen == [["/usr/bin/numastat", "-m"]] and parse_numastat_table(r.text).nodes == (0,)


# ----------------------------------------------------------------------------- sysfs text


def test_node_meminfo_scales_kb_and_keeps_page_counts():
    text = "Node 0 MemTotal:        5335244 kB\nNode 0 Active(anon):       1536 kB\nNode 0 HugePages_Total:     4\n"
    m = parse_node_meminfo(text)
    assert m == {"MemTotal": 5335244 * 1024, "Active(anon)": 1536 * 1024, "HugePages_Total": 4}


@pytest.mark.parametrize("text, gts, gen", [
    ("16.0 GT/s PCIe\n", 16.0, 4), ("8 GT/s\n", 8.0, 3), ("2.5 GT/s PCIe", 2.5, 1), ("32.0 GT/s PCIe", 32.0, 5),
    ("Unknown\n", None, None), ("", None, None),
])
def test_link_speed(text, gts, gen):
    assert parse_link_speed(text) == gts
    assert speed_to_gen(parse_link_speed(text)) == gen


def test_link_rate_per_generation():
    assert link_rate_gbps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert link_rate_gbps(5, 16) == pytest.approx(63.02, abs=0.01)
    assert link_rate_gbps(3, 8) == pytest.approx(7.88, abs=0.01)
    assert link_rate_gbps(1, 16) == pytest.approx(4.0)
    assert link_rate_gbps(None, 16) is None and link_rate_gbps(4, None) is None and link_rate_gbps(9, 16) is None


def test_bdf_forms():
    assert sysfs_bdf("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bdf("0000:3b:00.0") == "0000:3b:00.0"
    assert sysfs_bdf("3b:00.0") == "0000:3b:00.0"


def test_cpulist_and_masks():
    assert parse_cpulist("0-3,8-9,12\n") == (0, 1, 2, 3, 8, 9, 12)
    assert parse_cpulist("\n") == ()
    with pytest.raises(ValueError):
        parse_cpulist("a-b")
    assert mask_to_ids([0b1011, 1]) == (0, 1, 3, 64)


# ----------------------------------------------------------------------------- host text


def test_cpu_model_and_sockets():
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\nphysical id\t: 0\n" \
          "processor\t: 1\nmodel name\t: AMD EPYC 9654 96-Core Processor\nphysical id\t: 1\n"
    assert parse_cpu_model(x86) == "AMD EPYC 9654 96-Core Processor"
    assert count_sockets(x86) == 2
    assert parse_cpu_model("processor : 0\nBogoMIPS : 50.00\n") is None
    assert count_sockets("processor : 0\n") is None


def test_meminfo():
    m = parse_meminfo("MemTotal:       24684084 kB\nMemAvailable:   23508772 kB\nHugePages_Total:       0\n")
    assert m == {"MemTotal": 24684084 * 1024, "MemAvailable": 23508772 * 1024, "HugePages_Total": 0}


# ----------------------------------------------------------------------------- nvidia-smi text

# Shaped like `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` on a two-GPU host.
SMI_BASIC = ("0, NVIDIA H100 80GB HBM3, GPU-8e3f2b1c-0000-1111-2222-333344445555, 00000000:19:00.0, 550.54.15, "
             "81559, 4, 81004\n"
             "1, NVIDIA H100 80GB HBM3, GPU-9a1b2c3d-0000-1111-2222-333344445555, 00000000:3B:00.0, 550.54.15, "
             "81559, 1021, 79987\n")


def test_smi_csv_cells():
    rows = parse_query_csv("0, [N/A]\n1, 4\n", ("index", "pcie.link.gen.max"))
    assert rows[0]["pcie.link.gen.max"].text is None and "[N/A]" in rows[0]["pcie.link.gen.max"].reason
    assert rows[1]["pcie.link.gen.max"].text == "4"
    with pytest.raises(ValueError):
        parse_query_csv("0, 1, 2\n", ("index", "name"))


def test_smi_gpus_with_extended_fields_queried_separately():
    extended = {
        "memory.reserved": "0, 330\n1, 330\n",
        "pcie.link.gen.current": "0, 1\n1, 5\n",
        "pcie.link.gen.max": "0, 5\n1, 5\n",
        "pcie.link.gen.gpumax": None,  # this driver does not know the field: the query failed
        "pcie.link.width.current": "0, 16\n1, [Not Supported]\n",
        "pcie.link.width.max": "0, 16\n1, 16\n",
    }
    gpus, driver = gpus_from_queries(SMI_BASIC, extended)
    assert driver == "550.54.15"
    g0, g1 = gpus
    assert g0.name == "NVIDIA H100 80GB HBM3" and g0.pci_bus_id == "00000000:19:00.0"
    assert g0.mem_total_bytes == 81559 << 20 and g0.mem_free_bytes == 81004 << 20 and g1.mem_used_bytes == 1021 << 20
    assert g0.mem_reserved_bytes == 330 << 20
    assert g0.pcie_gen_current == 1 and g0.pcie_gen_max == 5 and g0.pcie_width_current == 16
    assert g0.pcie_gen_gpu_max is None
    why = {r.field: r.why for r in g1.reasons}
    assert "pcie.link.gen.gpumax" in why["pcie_gen_gpu_max"]
    assert "[Not Supported]" in why["pcie_width_current"] and g1.pcie_width_current is None
    assert g0.source == "nvidia-smi"


def test_probe_nvidia_smi_issues_one_query_per_extended_field():
    calls = []

    def run(argv):
        calls.append(argv[1])
        if argv[1].startswith("--query-gpu=index,name"):
            return _Proc(0, SMI_BASIC)
        if "gpumax" in argv[1]:
            return _Proc(2, 'Field "pcie.link.gen.gpumax" is not a valid field to query.\n')
        return _Proc(0, "0, 4\n1, 4\n")

    report = probe_nvidia_smi(which=lambda n: "/usr/bin/nvidia-smi", run=run)
    assert report.available and len(report.gpus) == 2
    assert calls[0] == f"--query-gpu={','.join(BASIC_FIELDS)}"
    assert len(calls) == 1 + 6 and all(c.startswith("--query-gpu=index,") for c in calls[1:])
    assert report.gpus[0].pcie_gen_gpu_max is None and report.gpus[0].pcie_gen_max == 4


def test_probe_nvidia_smi_missing_or_failing():
    assert "not found" in probe_nvidia_smi(which=lambda n: None).reason
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
    r = probe_nvidia_smi(which=lambda n: "/x", run=lambda argv: _Proc(9, msg))
    assert not r.available and "couldn't communicate" in r.reason


# ----------------------------------------------------------------------------- small helpers


def test_summarize_median_and_spread():
    m = summarize(1 << 20, 4, [10.0, 12.0, 11.0, 30.0, 9.0])
    assert m.median_gbps == 11.0 and m.min_gbps == 9.0 and m.max_gbps == 30.0 and m.spread_gbps == 21.0
    assert m.samples == 5 and m.iterations == 4
    with pytest.raises(ValueError):
        summarize(1, 1, [])


def test_sweep_plans():
    full = sweep_plan("full", "gpu", extra_sizes=(7 * (1 << 20) + 2,))
    assert full.sizes_bytes[0] == 64 << 10 and full.sizes_bytes[-1] >= 1 << 30
    assert 7 * (1 << 20) in full.sizes_bytes  # one real expert, rounded down to whole float32 words
    assert full.samples >= 5 and full.warmup >= 1
    quick = sweep_plan("quick", "host")
    assert quick.samples >= 5 and max(quick.sizes_bytes) <= 64 << 20
    assert SweepPlan((1 << 16,), target_bytes=1 << 20).iterations(1 << 16) == 16
    assert SweepPlan((1 << 30,), target_bytes=1 << 20).iterations(1 << 30) == 1
    with pytest.raises(ValueError):
        sweep_plan("slow", "gpu")


def test_collect_reasons_builds_json_paths():
    from hotsplit_probes.common import GpuDevice

    g = GpuDevice.unreadable(3, "GPU is lost", "nvml")
    paths = collect_reasons([g], "gpus")
    assert {"field": "gpus[0].mem_free_bytes", "reason": "GPU is lost"} in paths
    assert g.index == 3 and g.name is None
