"""`hotsplit probe` end to end on this machine (real sysfs, psutil, NVML, timings), plus placement checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hotsplit_probes.host import parse_meminfo
from hotsplit_probes.hostmem import HostPages
from hotsplit_probes.sysfs import list_numa_nodes

LINUX = Path("/proc/meminfo").exists()


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not LINUX, reason="compares against /proc and sysfs")
def test_probe_json_on_this_machine(cli, tmp_path):
    out = tmp_path / "platform.json"
    r = cli("probe", "--json", "-o", out)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc == json.loads(out.read_text())
    assert doc["schema"] == "hotsplit.platform/1" and doc["created"].endswith("Z")
    host = doc["host"]
    meminfo = parse_meminfo(Path("/proc/meminfo").read_text())
    assert host["mem_total_bytes"] == meminfo["MemTotal"]
    assert host["mem_available_bytes"] == pytest.approx(meminfo["MemAvailable"], rel=0.1)
    nodes = list_numa_nodes("/")
    assert len(host["numa_nodes"]) == (len(nodes) if nodes else 0)
    assert host["copy_gbps"] > 0 and all(c["copy"][0]["samples"] >= 5 for c in host["copy"])
    reasons = {r["field"]: r["reason"] for r in doc["reasons"]}
    if not cuda_available() and not doc["gpus"]:
        assert doc["gpus"] == [] and reasons["gpus"]


def test_probe_human_output(cli):
    r = cli("probe")
    assert r.code == 0, r.err
    assert "NUMA nodes" in r.out and "host memory copy" in r.out
    assert "hotsplit probe -o platform.json" in r.err


def test_quick_and_full_exclude_each_other(cli, tmp_path):
    out = tmp_path / "p.json"
    r = cli("probe", "--quick", "--full", "-o", out)
    assert r.code == 2 and "exclude" in r.err and r.out == ""
    assert not out.exists()


def test_bad_recipe_refuses_before_measuring(cli, tmp_path):
    out = tmp_path / "p.json"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel:\n  hidden_size: 0\n")
    r = cli("probe", "--recipe", bad, "-o", out)
    assert r.code == 2 and r.err.startswith("error: ") and not out.exists()
    r = cli("probe", "--recipe", "no-such-recipe", "-o", out)
    assert r.code == 2 and not out.exists()


def test_bad_knob_refuses(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_VRAM_RESERVE_GIB", "-1")
    out = tmp_path / "p.json"
    r = cli("probe", "--recipe", "tiny", "-o", out)
    assert r.code == 2 and "HOTSPLIT_VRAM_RESERVE_GIB" in r.err and not out.exists()


def test_missing_output_folder_fails_cleanly(cli, tmp_path):
    r = cli("probe", "-o", tmp_path / "nope" / "p.json")
    assert r.code == 2 and "does not exist" in r.err and r.out == ""


def test_existing_file_survives_a_failed_run(cli, tmp_path, monkeypatch):
    import hotsplit_cli.commands.probe as probe_cmd

    out = tmp_path / "p.json"
    out.write_text("good")

    def boom():
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_cmd, "_sources", boom)
    cli("probe", "-o", out)
    assert out.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_recipe_on_cpu_machine_reports_budget_reason(cli, tmp_path):
    r = cli("probe", "--json", "--recipe", "tiny")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["recipe"]["expert_bytes"] == 3 * 256 * 128 * 2
    if not doc["gpus"]:
        assert any(x["field"] == "gpus[*].hot_budget" for x in doc["reasons"])


def test_host_pages_are_placed_and_verified():
    nodes = list_numa_nodes("/") or (0,)
    buf = HostPages(4 << 20, nodes[0], fill=1)
    assert buf.array().nbytes == 4 << 20 and int(buf.array()[123]) == 1
    assert buf.location.wanted_node == nodes[0]
    if buf.bind_error is None:
        assert buf.location.verified is True and buf.location.share_by_node[nodes[0]] >= 0.99
    loose = HostPages(1 << 20, None)
    assert loose.location.verified is None and loose.location.detail == "not bound to a node"
    assert sum(loose.location.share_by_node.values()) == pytest.approx(1.0)
