"""`hotsplit recipe --model DIR`: a recipe written from a checkpoint's config.json and safetensors
headers, and every checkpoint recipe checked against config.json before anything loads."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from hotsplit_cli.cli import main
from hotsplit_cli.config.checkpoint import CHECKPOINT_FAMILIES
from hotsplit_cli.config.recipe import load_recipe

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")


def _header_params(folder) -> int:
    from safetensors import safe_open

    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            total += sum(_prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.mark.parametrize("family", CHECKPOINT_FAMILIES)
def test_every_family_gets_its_config_geometry_and_header_param_count(checkpoints, family, tmp_path, capsys):
    from transformers import AutoConfig

    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(checkpoints[family]), "--gpu-mem-gib", "1", "-o", str(out)]) == 0
    rec = load_recipe(out)
    config = AutoConfig.from_pretrained(checkpoints[family])
    m = rec.model
    assert (m.kind, m.family, m.hidden_size, m.num_hidden_layers) == ("hf", family, config.hidden_size,
                                                                        config.num_hidden_layers)
    assert m.num_experts == 8 and m.top_k == 2 and m.expert_dtype == "fp32"
    assert m.total_params == _header_params(checkpoints[family])
    assert "safetensors headers" in out.read_text()
    assert main(["ledger", str(out), "--hot-gib", "0.0001"]) == 0  # plans without an edit


def test_moe_layers_and_experts_equal_what_the_runtime_loads(checkpoints, tmp_path):
    import torch
    from hotsplit_runtime.device import choose_device
    from hotsplit_runtime.hf.loader import load_model

    from hotsplit_cli.config.checkpoint import read_geometry

    for family in ("qwen3_moe", "deepseek_v3", "mimo_v2_flash", "qwen2_moe"):
        g = read_geometry(checkpoints[family])
        hm = load_model(checkpoints[family], choose_device("cpu"), torch.float32)
        assert (g.moe_layer_ids, g.num_experts, g.top_k) == (hm.layer_ids, hm.num_experts, hm.top_k), family


def _config_only(src, dst, *, total_size=None, **changes):
    """A folder with only config.json (changed) and, with `total_size`, an index naming no file here."""
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    if total_size is not None:
        (dst / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": {"lm_head.weight": "model-00001.safetensors"}}))
    return dst


def test_config_and_index_alone_give_the_param_count_and_say_it_was_computed(checkpoints, tmp_path, capsys):
    src = checkpoints["qwen3_moe"]
    exact = _header_params(src)
    folder = _config_only(src, tmp_path / "cfg", total_size=4 * exact)
    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(folder / "config.json"), "--gpu-mem-gib", "1", "-o", str(out)]) == 0
    assert load_recipe(out).model.total_params == exact
    assert "computed: index total_size" in out.read_text()
    bare = _config_only(src, tmp_path / "bare")
    assert main(["recipe", "--model", str(bare), "--gpu-mem-gib", "1", "-o", str(tmp_path / "b.yaml")]) == 0
    text = (tmp_path / "b.yaml").read_text()
    assert "computed from config.json's geometry, approximate" in text
    assert abs(load_recipe(tmp_path / "b.yaml").model.total_params / exact - 1) < 0.01


@pytest.mark.parametrize(("quant", "dtype"), [
    ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}, "mxfp4")])
def test_a_quantization_config_sets_the_expert_dtype(checkpoints, tmp_path, quant, dtype):
    family = "deepseek_v3" if dtype == "fp8" else "gpt_oss"
    folder = _config_only(checkpoints[family], tmp_path / "q", total_size=123_456, quantization_config=quant,
                          dtype="bfloat16")
    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(folder), "--gpu-mem-gib", "1", "-o", str(out)]) == 0
    m = load_recipe(out).model
    assert m.expert_dtype == dtype and m.dense_dtype_bytes == 2
    assert "quantization_config.quant_method" in out.read_text()
    assert "index total_size mixes quantised and unquantised bytes" in out.read_text()


def test_an_unsupported_model_type_is_one_line_naming_the_supported_list(checkpoints, tmp_path, capsys):
    folder = _config_only(checkpoints["qwen3_moe"], tmp_path / "llama", model_type="llama")
    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(folder), "--gpu-mem-gib", "1", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_type 'llama' is not supported" in err
    assert "qwen3_moe, qwen2_moe, mixtral" in err and not out.exists()


def test_without_gpu_memory_nothing_is_written(checkpoints, tmp_path, capsys):
    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(checkpoints["qwen3_moe"]), "-o", str(out)]) == 2
    assert "pass --platform platform.json" in capsys.readouterr().err and not out.exists()


_CHANGED = {"family": "mixtral", "hidden_size": 33, "moe_intermediate_size": 17, "num_hidden_layers": 4,
            "moe_layers": [2], "num_experts": 9, "top_k": 3, "num_shared_experts": 1, "expert_dtype": "bf16"}


@pytest.fixture(scope="module")
def written(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "r.yaml"
    assert main(["recipe", "--model", str(checkpoints["qwen3_moe"]), "--gpu-mem-gib", "1", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("field", list(_CHANGED))
def test_a_recipe_field_off_by_one_is_refused_naming_the_field_and_both_values(written, field, tmp_path, capsys):
    doc = yaml.safe_load(written.read_text())
    want = doc["model"][field]
    doc["model"][field] = _CHANGED[field]
    doc["model"]["path"] = str((written.parent / doc["model"]["path"]).resolve())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    hist, plan = tmp_path / "h.json", tmp_path / "plan.json"
    start = time.perf_counter()
    code = main(["plan", str(hist), "--recipe", str(bad), "-o", str(plan)])
    took = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and took < 1.0
    assert err.startswith(f"error: model.{field}: the recipe says {_CHANGED[field]!r}, the checkpoint's config.json "
                          f"says {want!r}")
    assert not plan.exists()


def _commands(bad, tmp_path):
    """Each command that takes a recipe, given `bad`, and the file it would write."""
    from tests.export.helpers import make_plan, synthetic_hist

    hist = synthetic_hist(tmp_path / "tiny-h.json", "tiny")
    plan = make_plan(tmp_path, hist, "tiny", "0.004", "tiny-plan.json")
    out = tmp_path / "out"
    return {"plan": (["plan", hist, "--recipe", bad, "-o", f"{out}.json"], f"{out}.json"),
            "balance": (["balance", bad, "-o", f"{out}.json"], f"{out}.json"),
            "run": (["run", bad, "--log-jsonl", f"{out}.jsonl"], f"{out}.jsonl"),
            "simulate": (["simulate", "--trace", tmp_path / "t.npz", "--recipe", bad, "--plot", f"{out}.png"],
                         f"{out}.png"),
            "place": (["place", hist, "--recipe", bad, "--ranks", "2", "-o", f"{out}.json"], f"{out}.json"),
            "ledger": (["ledger", bad], None),
            "export": (["export", plan, "--to", "ktransformers", "--recipe", bad, "-o", f"{out}.pt"], f"{out}.pt")}


@pytest.mark.parametrize("command", ["plan", "balance", "run", "simulate", "place", "ledger", "export"])
def test_every_command_that_takes_the_recipe_refuses_it_before_any_work(written, command, tmp_path, capsys):
    doc = yaml.safe_load(written.read_text())
    doc["model"]["hidden_size"] += 1
    doc["model"]["path"] = str((written.parent / doc["model"]["path"]).resolve())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    args, out = _commands(bad, tmp_path)[command]
    capsys.readouterr()
    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: model.hidden_size: the recipe says ")
    assert out is None or not (tmp_path / out).exists()


def test_an_fp8_checkpoint_gets_fp8_experts_and_its_parameters_without_the_scales(checkpoints, tmp_path):
    from hotsplit_runtime.fp8 import Fp8Format
    from safetensors import safe_open

    from tests.runtime.test_hf_fp8 import BLOCK, write_fp8

    fp8 = tmp_path / "fp8"
    write_fp8(checkpoints["deepseek_v3"], fp8, Fp8Format(BLOCK))
    out = tmp_path / "r.yaml"
    assert main(["recipe", "--model", str(fp8), "--gpu-mem-gib", "1", "-o", str(out)]) == 0
    m = load_recipe(out).model
    with safe_open(str(fp8 / "model.safetensors"), framework="pt") as st:
        params = sum(_prod(st.get_slice(k).get_shape()) for k in st.keys() if not k.endswith("_scale_inv"))
    assert (m.expert_dtype, m.total_params) == ("fp8", params)
    assert params < _header_params(fp8)  # the block scales are storage, not parameters
    assert main(["ledger", str(out), "--hot-gib", "0.0001"]) == 0  # plans without an edit
