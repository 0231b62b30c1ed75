"""`hotsplit export` refusals (one `error:` line, nothing written), its JSON document, and the
sglang target being what `place --format sglang` writes."""

from __future__ import annotations

import json

import pytest

from hotsplit_cli.export.ktransformers import exact_ratio
from tests.export.helpers import make_placement, make_plan, synthetic_hist


@pytest.fixture
def tiny(tmp_path):
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    return {"hist": hist, "plan": make_plan(tmp_path, hist, "tiny", "0.004"),
            "placement": make_placement(tmp_path, hist, 4, 4)}


def refused(cli, tmp_path, code: int, *args, says: str) -> None:
    """One error line with `says`, the exit code, and no new file."""
    before = set(tmp_path.iterdir())
    r = cli("export", *args)
    assert r.code == code and r.out == "", r
    assert r.err.startswith("error: ") and r.err.count("\n") == 1 and says in r.err, r.err
    assert set(tmp_path.iterdir()) == before


def test_the_wrong_file_kind_is_refused(cli, tmp_path, tiny):
    refused(cli, tmp_path, 1, tiny["placement"], "--to", "ktransformers", "-o", tmp_path / "kt.pt",
            says="is a hotsplit.placement file; --to ktransformers takes a hotsplit.plan file")
    refused(cli, tmp_path, 1, tiny["plan"], "--to", "trtllm", "--recipe", "tiny", "-o", tmp_path / "lb.yaml",
            says="is a hotsplit.plan file; --to trtllm takes a hotsplit.placement file")
    refused(cli, tmp_path, 1, tiny["hist"], "--to", "llama.cpp", "-o", tmp_path / "a.txt",
            says="is a hotsplit.hist file")


def test_an_ep_plan_is_refused_for_ktransformers(cli, tmp_path):
    hist = synthetic_hist(tmp_path / "h4.json", "tiny-ep4")
    plan = make_plan(tmp_path, hist, "tiny-ep4", "0.002", "ep4.json")
    refused(cli, tmp_path, 1, plan, "--to", "ktransformers", "-o", tmp_path / "kt.pt",
            says="has no expert parallelism (KTransformers #2002), but")


def test_a_tp_plan_is_refused_for_llamacpp(cli, tmp_path):
    hist = synthetic_hist(tmp_path / "h3.json", "deepseek-v3")
    plan = make_plan(tmp_path, hist, "deepseek-v3", "20", "tp8.json")
    refused(cli, tmp_path, 1, plan, "--to", "llama.cpp", "-o", tmp_path / "a.txt",
            says="cannot express a tp=8 ep=1 plan")


def test_a_placement_whose_ranks_do_not_divide_its_slots_is_refused(cli, tmp_path, tiny):
    doc = json.loads(tiny["placement"].read_text())
    doc["num_ranks"] = 5  # 36 slots per layer
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    for engine, name in (("trtllm", "lb.yaml"), ("vllm-ascend", "m.json"), ("sglang", "s.json")):
        refused(cli, tmp_path, 1, bad, "--to", engine, "--recipe", "tiny", "-o", tmp_path / name,
                says="`num_ranks` 5 does not divide 36 physical experts")


def test_a_recipe_that_does_not_match_the_file_is_refused(cli, tmp_path, tiny):
    refused(cli, tmp_path, 1, tiny["plan"], "--to", "ktransformers", "--recipe", "deepseek-v2-lite",
            "-o", tmp_path / "kt.pt", says="a plan for recipe 'tiny', not 'deepseek-v2-lite'")
    refused(cli, tmp_path, 1, tiny["placement"], "--to", "trtllm", "--recipe", "deepseek-v3-ep8",
            "-o", tmp_path / "lb.yaml", says="recipe 'deepseek-v3-ep8' has 58 MoE layers x 256 experts")
    refused(cli, tmp_path, 2, tiny["placement"], "--to", "vllm-ascend", "-o", tmp_path / "m.json",
            says="needs --recipe")


@pytest.mark.parametrize("engine, name, want", [
    ("ktransformers", "kt.json", ".pt"), ("llama.cpp", "args.sh", ".txt"), ("trtllm", "lb.json", ".yaml"),
    ("vllm-ascend", "map.yaml", ".json"), ("sglang", "loc.pt", ".json"),
    # The engines compare the suffix exactly: KTransformers reads kt.PT as no file (uniform placement).
    ("ktransformers", "kt.PT", ".pt"), ("vllm-ascend", "map.JSON", ".json")])
def test_an_output_the_engine_would_not_read_is_refused(cli, tmp_path, tiny, engine, name, want):
    src = tiny["plan"] if engine in ("ktransformers", "llama.cpp") else tiny["placement"]
    refused(cli, tmp_path, 2, src, "--to", engine, "--recipe", "tiny", "-o", tmp_path / name,
            says=f"needs a name ending in {want}")


def test_an_unknown_engine_and_a_moved_histogram_are_refused(cli, tmp_path, tiny):
    refused(cli, tmp_path, 2, tiny["plan"], "--to", "vllm", "-o", tmp_path / "x.json", says="must be one of sglang")
    tiny["hist"].rename(tmp_path / "moved.json")
    refused(cli, tmp_path, 1, tiny["plan"], "--to", "llama.cpp", "-o", tmp_path / "a.txt", says="pass it with --hist")
    r = cli("export", tiny["plan"], "--to", "llama.cpp", "--hist", tmp_path / "moved.json", "-o", tmp_path / "a.txt")
    assert r.code == 0, r.err


def test_json_document(cli, tmp_path, tiny):
    r = cli("export", tiny["plan"], "--to", "llama.cpp", "-o", tmp_path / "a.txt", "--json")
    doc = json.loads(r.out)
    assert {"engine", "file", "flags", "gpu_experts", "predicted_hit_rate", "plan_hit_rate"} <= set(doc)
    assert doc["engine"] == "llama.cpp" and doc["file"] == str(tmp_path / "a.txt")
    assert doc["warnings"] and "cannot express the plan exactly" in doc["warnings"][0]
    assert set(doc["gpu_experts"]) == {"1", "2", "3", "4"}


def test_sglang_is_what_place_format_sglang_writes(cli, tmp_path, tiny):
    assert cli("place", tiny["hist"], "--ranks", "4", "--redundant", "4", "--format", "sglang", "--recipe", "tiny",
               "-o", tmp_path / "placed.json").code == 0
    r = cli("export", tiny["placement"], "--to", "sglang", "--recipe", "tiny", "-o", tmp_path / "exported.json")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "exported.json").read_text()) == json.loads((tmp_path / "placed.json").read_text())
    assert "--init-expert-location" in r.out


def test_trtllm_writes_only_the_three_keys_with_integer_layers(cli, tmp_path, tiny):
    import yaml

    r = cli("export", tiny["placement"], "--to", "trtllm", "--recipe", "tiny", "--online", "2",
            "-o", tmp_path / "lb.yaml")
    assert r.code == 0, r.err
    doc = yaml.safe_load((tmp_path / "lb.yaml").read_text())
    assert set(doc) == {"num_slots", "layer_updates_per_iter", "initial_global_assignments"}
    assert doc["layer_updates_per_iter"] == 2 and list(doc["initial_global_assignments"]) == [1, 2, 3, 4]
    assert f"load_balancer: {tmp_path / 'lb.yaml'}" in r.out and "ep > 1" in r.out


@pytest.mark.parametrize("n, total", [(1, 49), (0, 49), (49, 49), (372, 1664), (1, 7424), (7423, 7424)])
def test_exact_ratio_is_exact_under_the_engines_arithmetic(n, total):
    assert int(total * float(exact_ratio(n, total))) == n
