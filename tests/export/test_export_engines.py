"""Acceptance of `hotsplit export`: each exported file is loaded by the engine's own code (see
engines.py) and the engine ends with exactly the exported GPU set or slot layout."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.placement.file import load_placement
from tests.export.engines import (
    ascend_layout,
    gguf_tensor_names,
    kt_masks,
    llamacpp_buffer,
    llamacpp_overrides,
    trtllm_rank_slots,
)
from tests.export.helpers import esft_hist, make_placement, make_plan, sglang_hist, synthetic_hist

TINY49 = """name: tiny49
model: {kind: synthetic, family: deepseek_v3, hidden_size: 256, moe_intermediate_size: 128, num_hidden_layers: 8,
  first_k_dense: 1, num_experts: 7, top_k: 2, num_shared_experts: 1, router: sigmoid, n_group: 1, topk_group: 1,
  routed_scaling_factor: 1.0, norm_topk_prob: true, expert_dtype: bf16, total_params: 5.0e6}
parallel: {tp: 1, ep: 1}
hardware: {gpu: cpu-demo, gpu_mem_gib: 0.5, kv_cache_gib: 0.0}
"""  # 7 MoE layers x 7 experts = 49: N / 49 loses one at N = 1


def export_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["export", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def hf_config(recipe_name: str) -> SimpleNamespace:
    """The HF config fields SGLang-kt reads, as the model's config.json gives them."""
    m = load_recipe(recipe_name).model
    cfg = SimpleNamespace(num_hidden_layers=m.num_hidden_layers, moe_layer_freq=1)
    if m.moe_layer_ids[0]:  # DeepSeek: n_routed_experts and first_k_dense_replace
        cfg.n_routed_experts, cfg.first_k_dense_replace = m.num_experts, m.moe_layer_ids[0]
    else:  # Qwen3-MoE: num_experts, no dense layer
        cfg.num_experts = m.num_experts
    return cfg


def check_kt(tmp: Path, capsys, plan: Path, recipe: str) -> dict:
    """Export to ktransformers and check the engine's mask is the plan's hot set, dense rows all-GPU."""
    out = tmp / "kt.pt"
    doc = export_json(capsys, str(plan), "--to", "ktransformers", "--recipe", recipe, "-o", str(out))
    ratio = doc["flags"][doc["flags"].index("--kt-gpu-experts-ratio") + 1]
    masks = kt_masks(out, ratio, hf_config(recipe))
    m = load_recipe(recipe).model
    hot = load_plan(plan).hot_LE(m.moe_layer_ids, m.num_experts, model=m.name)
    np.testing.assert_array_equal(masks[list(m.moe_layer_ids)], hot)
    dense = [i for i in range(m.num_hidden_layers) if i not in m.moe_layer_ids]
    assert masks[dense].all()
    assert doc["predicted_hit_rate"] == pytest.approx(doc["plan_hit_rate"])
    return doc


@pytest.mark.parametrize("hot_gib", ["0.02", "1.5", "6", "40"])  # 1 expert, some, most, every expert
def test_ktransformers_mask_is_the_plan_with_a_dense_layer(tmp_path, capsys, hot_gib):
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v2-lite")
    plan = make_plan(tmp_path, hist, "deepseek-v2-lite", hot_gib)
    doc = check_kt(tmp_path, capsys, plan, "deepseek-v2-lite")
    n = sum(len(r[0]) for r in doc["gpu_experts"].values())
    assert n == {"0.02": 1, "40": 1664}.get(hot_gib, n)


def test_ktransformers_ratio_keeps_the_one_expert_n_over_t_would_lose(tmp_path, capsys):
    (tmp_path / "tiny49.yaml").write_text(TINY49)
    recipe = str(tmp_path / "tiny49.yaml")
    assert int(49 * (1 / 49)) == 0  # the trap
    hist = synthetic_hist(tmp_path / "h.json", recipe, tokens=512)
    plan = make_plan(tmp_path, hist, recipe, "0.0002")  # one 192 KiB expert
    doc = check_kt(tmp_path, capsys, plan, recipe)
    assert sum(len(r[0]) for r in doc["gpu_experts"].values()) == 1


def test_ktransformers_on_qwen3_without_dense_layers(tmp_path, capsys):
    hist = synthetic_hist(tmp_path / "h.json", "qwen3-30b-a3b")
    check_kt(tmp_path, capsys, make_plan(tmp_path, hist, "qwen3-30b-a3b", "7"), "qwen3-30b-a3b")


def test_ktransformers_with_ties_at_the_cut(tmp_path, capsys):
    """Equal counts everywhere: the plan's choice among equals is what the engine gets."""
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v2-lite", skew=0.0)
    check_kt(tmp_path, capsys, make_plan(tmp_path, hist, "deepseek-v2-lite", "3"), "deepseek-v2-lite")


def check_llamacpp(tmp: Path, capsys, plan: Path, recipe: str, arch: str) -> dict:
    """The args through llama.cpp's override rules on the GGUF names move exactly the planned layers."""
    out = tmp / "args.txt"
    doc = export_json(capsys, str(plan), "--to", "llama.cpp", "-o", str(out))
    assert doc["flags"][:3] == ["llama-server", "-m", "MODEL.gguf"] and "MODEL.gguf" in doc["fill_in"]
    args = doc["flags"][3:]  # the file holds the arguments alone, for `llama-server -m M.gguf $(cat OUT)`
    assert out.read_text().split() == args and out.read_text().count("\n") == 1
    assert args[:2] == ["-ngl", "999"]
    overrides = llamacpp_overrides(args)
    assert all("," not in p and "=" not in p for p, _ in overrides)
    m = load_recipe(recipe).model
    gpu_layers = {int(k) for k, v in doc["gpu_experts"].items() if v[0]}
    for name in gguf_tensor_names(arch, m.num_hidden_layers, m.moe_layer_ids[0]):
        block = int(name.split(".")[1]) if name.startswith("blk.") else None
        routed = "_exps." in name
        want = "CPU" if routed and block not in gpu_layers else "CUDA0"
        assert llamacpp_buffer(name, overrides) == want, name
    return doc


def test_llamacpp_n_cpu_moe_moves_exactly_the_cpu_layers(tmp_path, capsys):
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v2-lite")
    doc = check_llamacpp(tmp_path, capsys, make_plan(tmp_path, hist, "deepseek-v2-lite", "6"),
                         "deepseek-v2-lite", "deepseek2")
    assert "--n-cpu-moe" in doc["flags"]
    assert doc["predicted_hit_rate"] < doc["plan_hit_rate"]


def test_llamacpp_ot_names_the_busiest_layers(tmp_path, capsys):
    """Unequal layers (a layer with fewer assignments): the -ot form picks the busiest layers."""
    from hotsplit_cli.traffic.hist import load_hist, save_hist

    path = synthetic_hist(tmp_path / "h.json", "qwen3-30b-a3b")
    h = load_hist(path)
    h.counts_LE[40:] *= 0.5  # late layers see half the routed assignments
    save_hist(path, h)
    doc = check_llamacpp(tmp_path, capsys, make_plan(tmp_path, path, "qwen3-30b-a3b", "10"),
                         "qwen3-30b-a3b", "qwen3moe")
    assert "-ot" in doc["flags"]
    on = sorted(int(k) for k, v in doc["gpu_experts"].items() if v[0])
    assert len(on) == 8 and max(on) < 40  # 10 GiB / (128 x 9 MiB) = 8 layers, none of the lighter ones


@pytest.mark.parametrize("hot_gib", ["0.5", "30"])  # no layer fits; every layer fits
def test_llamacpp_at_the_ends(tmp_path, capsys, hot_gib):
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v2-lite")
    doc = check_llamacpp(tmp_path, capsys, make_plan(tmp_path, hist, "deepseek-v2-lite", hot_gib),
                         "deepseek-v2-lite", "deepseek2")
    assert doc["predicted_hit_rate"] == (0.0 if hot_gib == "0.5" else pytest.approx(1.0))


def check_slots(tmp: Path, capsys, placement: Path, recipe: str) -> None:
    """trtllm and vllm-ascend: every rank and layer holds exactly the placement's phy2log slots."""
    p = load_placement(placement)
    E, R = json.loads(placement.read_text())["num_experts"], p.num_ranks
    S = p.slots_per_rank
    want = {layer: [p.phy2log_LP[i, r * S:(r + 1) * S].tolist() for r in range(R)] for i, layer in enumerate(p.layers)}
    yaml_out = tmp / "moe_load_balancer.yaml"
    doc = export_json(capsys, str(placement), "--to", "trtllm", "--recipe", recipe, "-o", str(yaml_out))
    assert trtllm_rank_slots(yaml_out, p.layers, E, R) == want
    assert {int(k): v for k, v in doc["gpu_experts"].items()} == want
    json_out = tmp / "eplb.json"
    doc = export_json(capsys, str(placement), "--to", "vllm-ascend", "--recipe", recipe, "-o", str(json_out))
    slots, log2phy = ascend_layout(json_out, len(p.layers), E, R)
    np.testing.assert_array_equal(slots, p.phy2log_LP)
    for k in range(len(p.layers)):  # every rank's log2phy names a slot holding that expert
        np.testing.assert_array_equal(p.phy2log_LP[k][log2phy[k]], np.broadcast_to(np.arange(E), (R, E)))
    config = json.loads(doc["flags"][doc["flags"].index("--additional-config") + 1])
    assert config == {"eplb_config": {"expert_map_path": str(json_out)}}


def test_trtllm_and_vllm_ascend_hold_the_placement(tmp_path, capsys):
    hist = synthetic_hist(tmp_path / "h.json", "tiny")
    check_slots(tmp_path, capsys, make_placement(tmp_path, hist, 4, redundant=4), "tiny")


@pytest.mark.slow
def test_real_deepseek_v3_ep8_placements(tmp_path, capsys):
    """SGLang's DeepSeek-R1 record, placed on 8 ranks with and without redundant experts."""
    hist = sglang_hist(tmp_path)
    for redundant in (0, 8):
        check_slots(tmp_path, capsys, make_placement(tmp_path, hist, 8, redundant, f"p{redundant}.json"),
                    "deepseek-v3-ep8")


def test_real_v2_lite_and_qwen3_plans(tmp_path, capsys):
    """ESFT's DeepSeek-V2-Lite routing; Qwen3-30B-A3B at its real shape (no public record: synthetic)."""
    plan = make_plan(tmp_path, esft_hist(tmp_path / "v2.json"), "deepseek-v2-lite", "6")
    kt = check_kt(tmp_path, capsys, plan, "deepseek-v2-lite")
    llama = check_llamacpp(tmp_path, capsys, plan, "deepseek-v2-lite", "deepseek2")
    assert llama["predicted_hit_rate"] < kt["predicted_hit_rate"] == pytest.approx(load_plan(plan).hit_rate)
    plan = make_plan(tmp_path, synthetic_hist(tmp_path / "q3.json", "qwen3-30b-a3b"), "qwen3-30b-a3b", "12", "q.json")
    check_kt(tmp_path, capsys, plan, "qwen3-30b-a3b")
    check_llamacpp(tmp_path, capsys, plan, "qwen3-30b-a3b", "qwen3moe")


def test_printed_line_is_the_flags(tmp_path, capsys):
    hist = synthetic_hist(tmp_path / "h.json", "deepseek-v2-lite")
    plan = make_plan(tmp_path, hist, "deepseek-v2-lite", "6")
    capsys.readouterr()
    assert main(["export", str(plan), "--to", "llama.cpp", "-o", str(tmp_path / "a.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = shlex.split(lines[lines.index("start llama.cpp with:") + 1])
    assert line == ["llama-server", "-m", "MODEL.gguf", *(tmp_path / "a.txt").read_text().split()]
