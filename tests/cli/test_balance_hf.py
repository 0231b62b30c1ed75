"""`hotsplit balance --model DIR` on a tiny Hugging Face checkpoint."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.trace import load_trace

pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from tests.fakes.hf import SENTENCES, build_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("bal") / "olmoe", "olmoe")


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    lines = [{"prompt": SENTENCES[0]}, {"messages": [{"role": "user", "content": SENTENCES[1]}]},
             {"prompt": "Hi"}]
    p.write_text("".join(orjson.dumps(x).decode() + "\n" for x in lines))
    return p


def test_balance_model_exact_windows_trace(ckpt, prompts, tmp_path, capsys):
    out, tr = tmp_path / "h.json", tmp_path / "t.npz"
    assert main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "4",
                 "--batch-size", "2", "--window-steps", "3", "--trace", str(tr), "-o", str(out), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    h = load_hist(out)
    assert h.layers == (0, 1, 2) and h.top_k == 2 and h.num_experts == 8
    assert (h.counts_LE.sum(1) == h.tokens * h.top_k).all()
    assert h.tokens == doc["tokens"] > 0
    np.testing.assert_array_equal(h.windows_WLE.sum(0), h.counts_LE)
    t = load_trace(tr, 8)
    np.testing.assert_array_equal(t.counts_LE(8), h.counts_LE)
    assert "olmoe checkpoint" in h.source


def test_balance_from_recipe_naming_checkpoint(ckpt, prompts, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: tiny-olmoe\nmodel:\n  kind: hf\n  path: {ckpt}\n  family: olmoe\n  hidden_size: 32\n"
        "  moe_intermediate_size: 64\n  num_hidden_layers: 3\n  num_experts: 8\n  top_k: 2\n  expert_dtype: fp32\n"
        "  total_params: 1.0e6\n"
        f"traffic:\n  kind: prompts\n  path: {prompts}\n  max_new_tokens: 2\n  batch: 4\n")
    out = tmp_path / "h.json"
    assert main(["balance", str(recipe), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "MoE layers" in captured.out and "wrote" in captured.err
    assert load_hist(out).model == "tiny-olmoe"


def test_balance_bad_model_folder(tmp_path, prompts, capsys):
    out = tmp_path / "h.json"
    assert main(["balance", "--model", str(tmp_path), "--prompts", str(prompts), "-o", str(out)]) == 1
    assert "no config.json" in capsys.readouterr().err
    assert not out.exists()


def test_unsupported_expert_layout_is_a_one_line_error(ckpt, prompts, tmp_path, capsys, monkeypatch):
    from transformers.models.olmoe import modeling_olmoe

    init = modeling_olmoe.OlmoeExperts.__init__

    def with_post_expert_norm(self, *args, **kwargs):  # as `@use_experts_implementation(has_post_expert_norm=True)`
        init(self, *args, **kwargs)
        self.has_post_expert_norm = True

    monkeypatch.setattr(modeling_olmoe.OlmoeExperts, "__init__", with_post_expert_norm)
    out = tmp_path / "h.json"
    assert main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "error: OlmoeExperts: experts with a norm after each expert are not supported; hotsplit runs experts with a "
        "fused gate_up_proj and a down_proj (docs/real-models.md lists the families)"]
    assert captured.out == "" and not out.exists()


def test_balance_model_writes_the_recipe_beside_the_histogram_and_plan_reads_it(ckpt, prompts, tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "2",
                 "-o", str(out)]) == 0
    beside = tmp_path / "h.recipe.yaml"
    assert load_hist(out).recipe == "h.recipe.yaml" and beside.is_file()
    capsys.readouterr()
    assert main(["plan", str(out), "--hot-gib", "0.0001", "--json"]) == 0
    captured = capsys.readouterr()
    assert f"recipe: {beside} (recorded in {out})" in captured.err
    assert orjson.loads(captured.out)["recipe"] == "h.recipe"


def test_balance_from_a_recipe_records_it(ckpt, prompts, tmp_path, capsys):
    from hotsplit_cli.config.recipe_writer import HardwareChoice, write_checkpoint_recipe

    recipe = tmp_path / "mine.yaml"
    recipe.write_text(write_checkpoint_recipe(ckpt, recipe, HardwareChoice("gpu", 1.0, "test"), prompts=prompts).text)
    out = tmp_path / "h.json"
    assert main(["balance", str(recipe), "--max-new-tokens", "2", "-o", str(out)]) == 0
    assert load_hist(out).recipe == str(recipe.resolve()) and not (tmp_path / "h.recipe.yaml").exists()


def test_plan_without_recipe_on_a_histogram_that_records_none_is_one_line(tmp_path, capsys):
    from hotsplit_cli.traffic.hist import save_hist
    from tests.conftest import make_hist

    hist = tmp_path / "old.json"
    save_hist(hist, make_hist(np.ones((2, 8))))
    plan = tmp_path / "plan.json"
    assert main(["plan", str(hist), "-o", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records no recipe" in err and "--recipe" in err and not plan.exists()
