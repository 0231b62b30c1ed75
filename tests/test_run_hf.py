"""`hotsplit run` on a real (tiny, random) Hugging Face checkpoint named by a recipe."""

from __future__ import annotations

import json

import orjson
import pytest
import torch

from hotsplit_cli.cli import main

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from tests.test_hf_models import SENTENCES, build_checkpoint, reference  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("run") / "qwen3", "qwen3_moe")


def _recipe(tmp_path, ckpt, prompts, hot_gib, dyn_steps=2):
    recipe = tmp_path / "r.yaml"
    # Geometry of tests.test_hf_models' qwen3_moe checkpoint: 3 layers, layer 0 dense, 8 experts, top-2.
    recipe.write_text(
        f"name: tiny-qwen3\nmodel:\n  kind: hf\n  path: {ckpt}\n  family: qwen3_moe\n  hidden_size: 32\n"
        "  moe_intermediate_size: 16\n  num_hidden_layers: 3\n  first_k_dense: 1\n  num_experts: 8\n  top_k: 2\n"
        "  expert_dtype: fp16\n  total_params: 1.0e5\n"
        f"traffic:\n  kind: prompts\n  path: {prompts}\n  max_new_tokens: 6\n  batch: 1\n"
        f"run:\n  device: cpu\nhotsplit:\n  hot_gib: {hot_gib}\n  dyn_steps: {dyn_steps}\n  dyn_margin: 1.0\n")
    return recipe


def test_run_checkpoint_generates_the_same_greedy_text_and_logs_hit_rates(ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(orjson.dumps({"prompt": s}).decode() + "\n" for s in SENTENCES[:2]))
    one = 3 * 32 * 16 * 2  # fp16 expert bytes of this geometry
    log = tmp_path / "log.jsonl"
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 5 * one / 2**30)), "--json", "--log-jsonl", str(log)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)["summary"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    ref = reference(ckpt)
    want = []
    for s in SENTENCES[:2]:
        ids = tok(s, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = ref.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        want.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    assert doc["texts"] == want
    assert doc["hot_experts"] == 5 and "prefill" in doc["plan_source"]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records and "hit rate" not in captured.out  # human lines go to stderr in --json mode
    assert {"step", "hit_rate_window", "hit_rate_total", "swaps", "bytes_copied", "copy_ms"} <= set(records[0])
    assert doc["hit_rate"] == records[-1]["hit_rate_total"] and 0 < doc["hit_rate"] < 1
    assert doc["tokens"] > 0 and doc["steps"] == records[-1]["step"]


def test_run_checkpoint_refuses_a_recipe_that_does_not_match(ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    recipe = _recipe(tmp_path, ckpt, prompts, 0.001)
    recipe.write_text(recipe.read_text().replace("num_experts: 8", "num_experts: 16"))
    code = main(["run", str(recipe)])
    err = capsys.readouterr().err
    assert code == 1 and "8 experts" in err and "recipe 'tiny-qwen3' says" in err
