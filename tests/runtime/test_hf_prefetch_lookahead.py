"""`run --prefetch lookahead` on tiny random checkpoints of every supported family: the greedy
text equals the run's without prefetch, and the recall it records equals an independent
computation from the hidden states plain transformers captures (test_hf_lookahead.py's)."""

from __future__ import annotations

import json

import orjson
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from hotsplit_runtime.hf.loader import FAMILIES  # noqa: E402

from hotsplit_cli.cli import main  # noqa: E402
from tests.cli.test_run_hf import _geometry, _recipe  # noqa: E402
from tests.fakes.hf import SENTENCES  # noqa: E402
from tests.runtime.test_hf_lookahead import independent_counts  # noqa: E402


def _run(recipe, monkeypatch, capsys, prefetch: str, guesses: int = 2) -> dict:
    monkeypatch.setenv("HOTSPLIT_PREFETCH", prefetch)
    monkeypatch.setenv("HOTSPLIT_PREFETCH_GUESSES", str(guesses))
    monkeypatch.setenv("HOTSPLIT_PREFETCH_SLOTS", "2")
    code = main(["run", str(recipe), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _prompts(tmp_path, n: int):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(orjson.dumps({"prompt": s}).decode() + "\n" for s in SENTENCES[:n]))
    return prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_text_is_the_same_with_lookahead_staging(checkpoints, family, tmp_path, monkeypatch, capsys):
    ckpt = checkpoints[family]
    recipe = _recipe(tmp_path, ckpt, _prompts(tmp_path, 2), 5, _geometry(ckpt))
    off = _run(recipe, monkeypatch, capsys, "off")
    on = _run(recipe, monkeypatch, capsys, "lookahead")
    assert on["texts"] == off["texts"] and all(on["texts"])
    p = on["summary"]["prefetch"]
    assert p["predictor"] == "lookahead" and p["slots"] == 2 and p["guesses"] == 2
    assert p["prefetched"] >= p["useful"] > 0 and p["staged_hits"] > 0  # staged experts were read
    assert on["plan"]["hot_experts"] == off["plan"]["hot_experts"] - 2  # 2 shared slots carved from the budget
    assert off["summary"].get("prefetch") is None


@pytest.mark.parametrize("family, guesses", [("mixtral", 2), ("qwen2_moe", 3), ("deepseek_v3", 3)])
def test_recorded_recall_equals_an_independent_computation(checkpoints, family, guesses, tmp_path, monkeypatch,
                                                           capsys):
    """Prefill only (no generated token is fed back), one prompt a step: the tokens the plain
    model's hidden states are captured on."""
    ckpt = checkpoints[family]
    recipe = _recipe(tmp_path, ckpt, _prompts(tmp_path, 3), 5, _geometry(ckpt))
    recipe.write_text(recipe.read_text().replace("max_new_tokens: 6", "max_new_tokens: 1"))
    look = _run(recipe, monkeypatch, capsys, "lookahead", guesses)["summary"]["prefetch"]["lookahead"]
    expect = independent_counts(ckpt, SENTENCES[:3], guesses)
    tokens, useful = sum(t for t, _ in expect.values()), sum(u for _, u in expect.values())
    assert (look["useful"], look["routed"], look["guesses"]) == (useful, 2 * tokens, guesses * tokens)
    assert look["recall"] == pytest.approx(useful / (2 * tokens))
