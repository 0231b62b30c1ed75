"""What an export checks in its inputs before it blames the engine: the plan's histogram by its
sha256, the placement's recorded recipe, and whether the GPU experts fit the recipe's GPU."""

from __future__ import annotations

import json

import pytest

from tests.export.helpers import make_placement, make_plan, synthetic_hist
from tests.export.test_export_cli import refused


@pytest.fixture
def tiny(tmp_path):
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    return {"hist": hist, "plan": make_plan(tmp_path, hist, "tiny", "0.004")}


def test_another_histogram_of_the_same_model_is_named_as_the_cause(cli, tmp_path, tiny):
    other = synthetic_hist(tmp_path / "other.json", "tiny", seed=1)
    refused(cli, tmp_path, 1, tiny["plan"], "--to", "ktransformers", "--hist", other, "-o", tmp_path / "kt.pt",
            says=f"--hist {other}: not the histogram {tiny['plan']} was made from")
    r = cli("export", tiny["plan"], "--to", "ktransformers", "--hist", tiny["hist"], "-o", tmp_path / "kt.pt")
    assert r.code == 0 and "cannot express" not in r.err, r.err


def test_a_histogram_rewritten_where_the_plan_names_it_is_refused(cli, tmp_path, tiny):
    synthetic_hist(tiny["hist"], "tiny", seed=1)  # same path, other traffic
    refused(cli, tmp_path, 1, tiny["plan"], "--to", "ktransformers", "-o", tmp_path / "kt.pt",
            says="is not there or has changed")


def test_a_plan_and_its_histogram_moved_together_still_export(cli, tmp_path, tiny):
    moved = tmp_path / "moved"
    moved.mkdir()
    plan = moved / "plan.json"
    tiny["plan"].rename(plan)
    tiny["hist"].rename(moved / "h.json")
    assert cli("export", plan, "--to", "llama.cpp", "-o", moved / "a.txt").code == 0


def test_a_placement_records_its_recipe_and_export_reads_it(cli, tmp_path, tiny):
    out = tmp_path / "p.json"
    assert cli("place", tiny["hist"], "--ranks", "4", "--recipe", "tiny", "-o", out).code == 0
    assert json.loads(out.read_text())["source"]["recipe"] == "tiny"
    r = cli("export", out, "--to", "trtllm", "-o", tmp_path / "lb.yaml")
    assert r.code == 0, r.err
    refused(cli, tmp_path, 1, out, "--to", "sglang", "--recipe", "deepseek-v3-ep8", "-o", tmp_path / "s.json",
            says="a placement for recipe 'tiny', not 'deepseek-v3-ep8'")


def test_a_placement_without_a_recipe_names_its_model_and_its_recipes(cli, tmp_path):
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v3-ep8")
    placement = make_placement(tmp_path, hist, 8)
    refused(cli, tmp_path, 2, placement, "--to", "sglang", "-o", tmp_path / "s.json",
            says="is a placement of deepseek-ai/DeepSeek-V3 that records no recipe; pass the recipe of "
                 "deepseek-ai/DeepSeek-V3: --recipe deepseek-v3")
    doc = json.loads(placement.read_text())
    del doc["source"]["model"], doc["source"]["recipe"]  # a file written before placements recorded them
    placement.write_text(json.dumps(doc))
    refused(cli, tmp_path, 2, placement, "--to", "vllm-ascend", "-o", tmp_path / "m.json",
            says="is a placement that names no model")
    assert cli("export", placement, "--to", "vllm-ascend", "--recipe", "deepseek-v3-ep8",
               "-o", tmp_path / "m.json").code == 0


def test_a_layout_above_the_gpu_memory_is_warned_by_place_and_export(cli, tmp_path):
    """DeepSeek-V3 on 8 ranks with 32 redundant experts: 36 fp8 experts x 58 layers = 85.66 GiB per
    rank, above the recipe's 79.60 GiB GPU (deepseek-v3-ep8.yaml, nvidia-smi's 81559 MiB)."""
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v3-ep8")
    out = tmp_path / "p.json"
    r = cli("place", hist, "--ranks", "8", "--redundant", "32", "--recipe", "deepseek-v3-ep8", "-o", out, "--json")
    doc = json.loads(r.out)
    assert doc["gpu_memory"]["fits"] is False and doc["gpu_memory"]["gpu_mem_bytes"] == int(79.6 * 2**30)
    assert any("85.66 GiB of GPU expert bytes per rank exceed the 79.60 GiB GPU" in w for w in doc["warnings"])
    for engine, name in (("sglang", "s.json"), ("trtllm", "lb.yaml"), ("vllm-ascend", "m.json")):
        r = cli("export", out, "--to", engine, "-o", tmp_path / name, "--json")
        doc = json.loads(r.out)
        assert doc["gpu_memory"] == {"expert_bytes": doc["gpu_bytes"], "gpu_mem_bytes": int(79.6 * 2**30),
                                     "fits": False}
        assert "85.66 GiB" in doc["warnings"][0] and "79.60 GiB" in doc["warnings"][0]
    r = cli("export", make_placement(tmp_path, hist, 8, 0, "fits.json"), "--to", "sglang", "--recipe",
            "deepseek-v3-ep8", "-o", tmp_path / "f.json", "--json")
    doc = json.loads(r.out)
    assert doc["gpu_memory"]["fits"] is True and "warnings" not in doc


def test_a_plan_export_reports_its_gpu_fit(cli, tmp_path, tiny):
    doc = json.loads(cli("export", tiny["plan"], "--to", "ktransformers", "-o", tmp_path / "kt.pt", "--json").out)
    assert doc["gpu_memory"]["fits"] is True and doc["gpu_memory"]["expert_bytes"] == doc["gpu_bytes"]
