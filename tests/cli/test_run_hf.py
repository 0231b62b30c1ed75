"""`hotsplit run` on a real (tiny, random) Hugging Face checkpoint named by a recipe."""

from __future__ import annotations

import json

import orjson
import pytest
import torch
import yaml

from hotsplit_cli.cli import main

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from hotsplit_runtime.hf.loader import FAMILIES  # noqa: E402

from tests.fakes.hf import SENTENCES, build_checkpoint, reference  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("run") / "qwen3", "qwen3_moe")


def _geometry(folder):
    """The recipe geometry of a test checkpoint: its config.json's, as `hotsplit recipe` writes it."""
    from hotsplit_cli.config.checkpoint import read_geometry

    g = read_geometry(folder)
    return {"family": g.family, "hidden_size": g.hidden_size, "moe_intermediate_size": g.moe_intermediate_size,
            "num_hidden_layers": g.num_hidden_layers, "moe_layers": list(g.moe_layer_ids),
            "num_experts": g.num_experts, "top_k": g.top_k, "num_shared_experts": g.num_shared_experts,
            "expert_dtype": g.expert_dtype, "expert_bias": g.expert_bias}


def _recipe(tmp_path, ckpt, prompts, hot_experts, geometry, dyn_steps=2):
    """A checkpoint recipe whose budget holds `hot_experts` experts (fp32 bytes of the geometry)."""
    g = geometry
    h, i = g["hidden_size"], g["moe_intermediate_size"]
    one = 3 * h * i * 4 + ((2 * i + h) * 4 if g["expert_bias"] else 0)  # gpt-oss experts carry biases
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "tiny-ckpt",
        "model": {"kind": "hf", "path": str(ckpt), "total_params": 1.0e6, **g},
        "traffic": {"kind": "prompts", "path": str(prompts), "max_new_tokens": 6, "batch": 1},
        "run": {"device": "cpu"},
        "hotsplit": {"hot_gib": hot_experts * one / 2**30, "dyn_steps": dyn_steps, "dyn_margin": 1.0},
    }))
    return recipe


@pytest.mark.parametrize("family", FAMILIES)
def test_run_checkpoint_generates_the_same_greedy_text_and_logs_hit_rates(checkpoints, family, tmp_path, capsys):  # noqa: F811
    ckpt = checkpoints[family]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(orjson.dumps({"prompt": s}).decode() + "\n" for s in SENTENCES[:2]))
    log = tmp_path / "log.jsonl"
    recipe = _recipe(tmp_path, ckpt, prompts, 5, _geometry(ckpt))
    code = main(["run", str(recipe), "--json", "--log-jsonl", str(log)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    run_doc = json.loads(captured.out)
    doc = run_doc["summary"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    ref = reference(ckpt)
    want = []
    for s in SENTENCES[:2]:
        ids = tok(s, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = ref.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        want.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    assert run_doc["texts"] == want  # where a checkpoint's texts are on N ranks too
    assert run_doc["plan"]["hot_experts"] == 5 and "prefill" in run_doc["plan"]["source"]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # Human lines go to stderr in --json mode (stdout may name the hit rate only in `warnings`).
    assert records and "hit rate (overall)" not in captured.out
    assert not any(line.startswith("step ") for line in captured.out.splitlines())
    assert {"step", "hit_rate_window", "hit_rate_total", "swaps", "bytes_copied", "copy_ms"} <= set(records[0])
    assert doc["hit_rate"] == records[-1]["hit_rate_total"] and 0 <= doc["hit_rate"] <= 1
    assert doc["tokens"] > 0 and doc["steps"] == records[-1]["step"]
    assert run_doc["kernel"] == "torch per expert" and run_doc["numa"]["policy"] == "preferred"
    assert doc["copy_ms"] == pytest.approx(sum(r["copy_ms"] for r in records))
    assert doc["bytes_copied"] == sum(r["bytes_copied"] for r in records)


def test_run_checkpoint_refuses_a_recipe_that_does_not_match(ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    recipe = _recipe(tmp_path, ckpt, prompts, 2, {**_geometry(ckpt), "num_experts": 16})
    code = main(["run", str(recipe)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: model.num_experts: the recipe says 16, the checkpoint's config.json "
                                        "says 8")


def test_without_transformers_a_checkpoint_run_is_refused_in_one_line(ckpt, tmp_path, capsys, monkeypatch):
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else found(name, *a))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    log = tmp_path / "log.jsonl"
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 2, _geometry(ckpt))), "--log-jsonl", str(log)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "a checkpoint recipe needs transformers" in err
    assert not log.exists()


def test_run_checkpoint_human_summary_and_plot(ckpt, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import hotsplit_runtime.hf.run as hf_run

    reads = []
    read = hf_run.read_prompts
    monkeypatch.setattr(hf_run, "read_prompts", lambda path: reads.append(path) or read(path))
    prompts = tmp_path / "p.txt"
    prompts.write_text(SENTENCES[0] + "\n")
    plot = tmp_path / "hits.png"
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 4, _geometry(ckpt))), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0
    assert len(reads) == 1  # the prompts file is read once: for the progress bar and the run alike
    for row in ("device", "torch per expert", "plan", "cold bank", "numa_policy", "copy time", "hit rate (overall)"):
        assert row in out, row
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_checkpoint_draws_a_bar_per_prompt_on_a_terminal(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then treats stdout and stderr as a terminal
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(s + "\n" for s in SENTENCES[:3]))
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 4, _geometry(ckpt)))])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "tiny-ckpt: prompts" in err and "3/3" in err


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cold_path", ["cpu", "split"])
def test_checkpoint_runs_with_a_cpu_cold_path_generate_the_same_text(checkpoints, family, cold_path, tmp_path,  # noqa: F811
                                                                     capsys, monkeypatch, fixed_rates_platform):
    """Every family's layout (transposed, biased, interleaved gate/up) computed by the CPU from the
    host cold bank gives transformers' greedy text. The rates are fixed (a platform file), so the
    split gives the CPU its share however loaded the machine is."""
    ckpt = checkpoints[family]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(orjson.dumps({"prompt": SENTENCES[0]}).decode() + "\n")
    monkeypatch.setenv("HOTSPLIT_COLD_PATH", cold_path)
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 2, _geometry(ckpt))), "--json",
                 "--platform", str(fixed_rates_platform)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok(SENTENCES[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = reference(ckpt).generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert doc["texts"] == [tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)]
    paths = doc["summary"]["cold_paths"]
    assert doc["knobs"]["cold_path"] == cold_path and paths["mode"] == cold_path
    # Without a GPU the device path is this CPU too: the split then gives the CPU worker nothing.
    one_cpu = "no GPU: the device path is this CPU" in paths["rates"]
    assert paths["cpu"]["experts"] > 0 if cold_path == "cpu" or not one_cpu else paths["cpu"]["experts"] == 0
    if cold_path == "cpu":
        assert paths["gpu"]["experts"] == 0
    assert f"CPU cold path ({cold_path}" in doc["kernel"]
    # a checkpoint run judges its cold paths' times like a synthetic one (hotset/verdict.py)
    judged = {v["name"] for v in doc["verdicts"]}
    assert judged == {f"cold_path.{k}" for k in ("gpu", "cpu") if paths[k]["experts"]}


def test_ctrl_c_in_a_checkpoint_run_prints_the_summary_so_far(checkpoints, tmp_path, capsys, monkeypatch):  # noqa: F811
    """As a synthetic run does: the summary of the steps so far, then what was written, exit 130."""
    from hotsplit_runtime.hf.steps import CheckpointEngine

    real = CheckpointEngine.step
    steps = {"n": 0}

    def stopped(self, forward):
        real(self, forward)
        steps["n"] += 1
        if steps["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(CheckpointEngine, "step", stopped)
    ckpt = checkpoints[FAMILIES[0]]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(orjson.dumps({"prompt": SENTENCES[0]}).decode() + "\n")
    log = tmp_path / "log.jsonl"
    code = main(["run", str(_recipe(tmp_path, ckpt, prompts, 2, _geometry(ckpt))), "--log-jsonl", str(log)])
    captured = capsys.readouterr()
    assert code == 130
    assert "(interrupted)" in captured.out and "hit rate (overall)" in captured.out
    records = log.read_text().splitlines()
    assert captured.err.splitlines()[-1] == f"error: interrupted after 3 steps; wrote {log} ({len(records)} records)"
