"""Exports of plans that store experts at fp8 / mxfp4 / per expert: llama.cpp gets each layer's
ggml type for `llama-quantize --tensor-type` (checked by llama-quantize's own matching rule on
every GGUF tensor name), KTransformers its CPU method; where the engine keeps its own precision
the hit rate is predicted at the engine's bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.export.precision import ggml_expert_bytes
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from tests.export.engines import gguf_tensor_names, kt_masks
from tests.export.test_export_engines import export_json, hf_config
from tests.planning.quality_fixture import write_quality_hist

V2 = "deepseek-v2-lite"


def _plan(tmp: Path, *args: str, hot_gib: str = "3") -> Path:
    hist = write_quality_hist(tmp / "h.json", V2, windows=2, seed=3)
    out = tmp / "plan.json"
    assert main(["plan", str(hist), "--recipe", V2, "--hot-gib", hot_gib, "-o", str(out), *args]) == 0
    return out


def llama_quantize_types(args: list[str], names: list[str], base: str) -> dict[str, str]:
    """llama-quantize's choice per tensor (src/llama-quant.cpp): each `--tensor-type` regex (the
    part before the first `=`, lowercased) tried with std::regex_search on the name; the last
    match wins; else the base type."""
    rules = []
    for i, a in enumerate(args):
        if a == "--tensor-type":
            pattern, _, ggml_type = args[i + 1].partition("=")
            rules.append((pattern.lower(), ggml_type))
    out = {}
    for name in names:
        chosen = base
        for pattern, ggml_type in rules:
            if re.search(pattern, name):
                chosen = ggml_type
        out[name] = chosen
    return out


def test_llamacpp_gets_each_layers_type_and_counts_its_bytes(tmp_path, capsys):
    plan = _plan(tmp_path, "--precision", "auto", "--max-error", "0.05")
    doc = export_json(capsys, str(plan), "--to", "llama.cpp", "-o", str(tmp_path / "a.txt"))
    m = load_recipe(V2).model
    precision = load_plan(plan).precision_LE(m.moe_layer_ids, m.num_experts)
    want = {layer: ("bf16" if "native" in row else "q8_0" if "fp8" in row else "mxfp4")
            for layer, row in zip(m.moe_layer_ids, precision, strict=True)}
    prepare = doc["prepare"]
    assert prepare[0] == "llama-quantize" and prepare[-3:] == ["MODEL-BF16.gguf", "MODEL.gguf", "BASE_TYPE"]
    assert "BASE_TYPE" in doc["fill_in"]
    types = llama_quantize_types(prepare, gguf_tensor_names("deepseek2", m.num_hidden_layers, 1), "BASE")
    for name, ggml_type in types.items():
        block = int(name.split(".")[1]) if name.startswith("blk.") else None
        assert ggml_type == (want[block] if "_exps." in name else "BASE"), name
    gpu = [int(k) for k, v in doc["gpu_experts"].items() if v[0]]
    assert doc["gpu_bytes"] == sum(64 * ggml_expert_bytes(load_recipe(V2), want[lid]) for lid in gpu) <= 3 * 2**30
    mixed = sum(len(set(row)) > 1 for row in precision)
    assert any(f"{mixed} layers with experts at several precisions take their most accurate one" in n
               for n in doc["notes"])


def test_a_native_plan_exports_for_llamacpp_as_before(tmp_path, capsys):
    plan = _plan(tmp_path)
    doc = export_json(capsys, str(plan), "--to", "llama.cpp", "-o", str(tmp_path / "a.txt"))
    assert doc["prepare"] is None and "BASE_TYPE" not in doc["fill_in"]
    assert doc["gpu_bytes"] == 64 * expert_bytes_per_rank(load_recipe(V2)) * sum(bool(v[0]) for v in
                                                                                  doc["gpu_experts"].values())


def test_an_mxfp4_plan_holds_more_llamacpp_layers_than_a_native_one(tmp_path, capsys):
    docs = {}
    for p in ("native", "mxfp4"):
        (tmp_path / p).mkdir()
        plan = _plan(tmp_path / p, "--precision", p)
        docs[p] = export_json(capsys, str(plan), "--to", "llama.cpp", "-o", str(tmp_path / p / "a.txt"))
    on = {p: sum(bool(v[0]) for v in d["gpu_experts"].values()) for p, d in docs.items()}
    assert on["mxfp4"] > on["native"] and docs["mxfp4"]["predicted_hit_rate"] > docs["native"]["predicted_hit_rate"]
    assert {a for a in docs["mxfp4"]["prepare"] if "=" in a} == {
        rf"blk\.{lid}\.ffn_(up|down|gate|gate_up)_(ch|)exps=mxfp4" for lid in range(1, 27)}


@pytest.mark.parametrize("precision, method", [("native", "BF16"), ("fp8", "FP8"), ("mxfp4", "MXFP4")])
def test_ktransformers_gets_its_cpu_method_and_keeps_its_gpu_experts_native(tmp_path, capsys, precision, method):
    plan = _plan(tmp_path, "--precision", precision)
    out = tmp_path / "kt.pt"
    doc = export_json(capsys, str(plan), "--to", "ktransformers", "-o", str(out))
    assert doc["flags"][doc["flags"].index("--kt-method") + 1] == method
    ratio = doc["flags"][doc["flags"].index("--kt-gpu-experts-ratio") + 1]
    m = load_recipe(V2).model
    masks = kt_masks(out, ratio, hf_config(V2))[list(m.moe_layer_ids)]
    native = expert_bytes_per_rank(load_recipe(V2))
    assert masks.sum() == min(m.num_experts * 26, 3 * 2**30 // native)  # the engine's bytes: the checkpoint's
    assert doc["gpu_bytes"] == masks.sum() * native
    plan_hot = load_plan(plan).hot_LE(m.moe_layer_ids, m.num_experts)
    if precision == "native":
        np.testing.assert_array_equal(masks, plan_hot)
    else:
        assert doc["predicted_hit_rate"] < doc["plan_hit_rate"]
        assert any("keeps its GPU experts at the checkpoint's precision (bf16)" in n for n in doc["notes"])


def test_export_json_has_prepare_for_every_engine(tmp_path, capsys):
    plan = _plan(tmp_path, "--precision", "fp8")
    r = main(["export", str(plan), "--to", "llama.cpp", "-o", str(tmp_path / "x.txt")])
    text = capsys.readouterr().out
    assert r == 0 and "first, store the experts at the plan's precisions:" in text and "llama-quantize" in text
    assert json.loads(json.dumps(export_json(capsys, str(plan), "--to", "ktransformers",
                                             "-o", str(tmp_path / "k.pt"))))["prepare"] is None
