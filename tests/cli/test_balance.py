"""`hotsplit balance`: prompt files, windows, and the synthetic model of a recipe."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.commands.balance import windows_of
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.prompts import read_prompts
from hotsplit_cli.traffic.trace import load_trace

pytest.importorskip("torch")


def test_read_prompts_jsonl_and_text(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a b"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert read_prompts(p) == ["a b", [{"role": "user", "content": "hi"}]]
    t = tmp_path / "p.txt"
    t.write_text("first prompt\n\n  \nsecond\n")
    assert read_prompts(t) == ["first prompt", "second"]


@pytest.mark.parametrize("content,msg", [
    ('{"prompt": "ok"}\n{"prompt": 3}\n', ":2: expected"),
    ('{"prompt": "ok"}\nnot json\n', ":2: not valid JSON"),
    ('{"messages": [{"role": "user"}]}\n', ":1: expected"),
    ("\n\n", "no prompts"),
])
def test_read_prompts_errors_name_the_line(tmp_path, content, msg):
    p = tmp_path / "p.jsonl"
    p.write_text(content)
    with pytest.raises(InputFileError, match=msg):
        read_prompts(p)


def test_windows_of_sums_consecutive_steps():
    steps = np.arange(5 * 2 * 3).reshape(5, 2, 3)
    w = windows_of(steps, 2)
    assert w.shape == (3, 2, 3)
    np.testing.assert_array_equal(w[0], steps[0] + steps[1])
    np.testing.assert_array_equal(w[2], steps[4])
    np.testing.assert_array_equal(w.sum(0), steps.sum(0))


def test_synthetic_balance_exact_with_windows_and_trace(tmp_path, capsys):
    out, tr = tmp_path / "h.json", tmp_path / "t.npz"
    assert main(["balance", "tiny", "--steps", "30", "--batch-size", "5", "--windows-steps", "7",
                 "--trace", str(tr), "-o", str(out), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    rec = load_recipe("tiny")
    h = load_hist(out)
    assert h.layers == rec.model.moe_layer_ids and h.tokens == 150 and h.top_k == rec.model.top_k
    assert (h.counts_LE.sum(1) == 150 * rec.model.top_k).all()
    assert h.windows_WLE.shape[0] == 5 and h.steps_per_window == 7
    np.testing.assert_array_equal(h.windows_WLE.sum(0), h.counts_LE)
    t = load_trace(tr, rec.model.num_experts)
    assert t.topk_ids_SLTK.shape == (30, len(h.layers), 5, rec.model.top_k)
    np.testing.assert_array_equal(t.counts_LE(rec.model.num_experts), h.counts_LE)
    assert doc["report"]["num_layers"] == len(h.layers)


def test_synthetic_balance_is_deterministic(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["balance", "--recipe", "tiny", "--steps", "5", "-o", str(a)]) == 0
    assert main(["balance", "--recipe", "tiny", "--steps", "5", "-o", str(b)]) == 0
    np.testing.assert_array_equal(load_hist(a).counts_LE, load_hist(b).counts_LE)


@pytest.mark.parametrize("args,code,msg", [
    (["balance"], 2, "needs --model DIR or a recipe"),
    (["balance", "tiny", "--windows-steps", "0"], 2, "--window-steps"),  # the earlier spelling, same check
    (["balance", "tiny", "--steps", "0"], 2, "--steps"),
    (["balance", "tiny", "--trace", "t.json"], 2, ".npz"),
    (["balance", "tiny", "--prompts", "p.txt"], 2, "synthetic model"),
    (["balance", "tiny", "--recipe", "tiny"], 2, "once"),
    (["balance", "tiny", "--dtype", "int8"], 2, "--dtype"),
])
def test_usage_errors_write_nothing(tmp_path, capsys, args, code, msg):
    out = tmp_path / "h.json"
    assert main([*args, "-o", str(out)]) == code
    assert msg in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("extra, per_rank", [([], 16), (["--batch-size", "5"], 5)])
def test_an_ep_recipe_records_the_jobs_step_every_ranks_batch(tmp_path, capsys, extra, per_rank):
    """tiny-ep4's traffic.batch is each rank's: a step of the job is 4 x that, so that a replay
    under `run` (which shards each step over the ranks) gives every rank the recipe's batch."""
    out, tr = tmp_path / "h.json", tmp_path / "t.npz"
    assert main(["balance", "tiny-ep4", "--steps", "3", "--trace", str(tr), "-o", str(out), *extra]) == 0
    assert f"synthetic routing: 3 steps x {4 * per_rank} tokens (4 ranks x {per_rank} each)" in capsys.readouterr().out
    rec = load_recipe("tiny-ep4")
    h, t = load_hist(out), load_trace(tr, rec.model.num_experts)
    assert h.tokens == 3 * 4 * per_rank
    assert t.topk_ids_SLTK.shape == (3, len(h.layers), 4 * per_rank, rec.model.top_k)
    from hotsplit_cli.placement.dispatch import token_shard

    shards = [token_shard(4 * per_rank, 4, r) for r in range(4)]
    assert [s.stop - s.start for s in shards] == [per_rank] * 4


def test_the_ep_replay_line_names_a_trace_that_is_not_the_recipes_batch():
    from hotsplit_cli.commands._run_ep import rank_tokens_words

    rec = load_recipe("tiny-ep4")
    assert rank_tokens_words(rec, "trace", 16, 4) == "each rank steps 16 tokens"
    assert rank_tokens_words(rec, "router", 16, 4) == "each rank steps 16 tokens"
    assert rank_tokens_words(rec, "trace", 4, 4) == (
        "each rank steps 4 tokens (the trace's steps shared by 4 ranks; traffic.batch is 16 per rank: "
        "`hotsplit balance tiny-ep4 --trace` records 4 x 16 per step)")
