"""`run --prefetch lookahead` and `--prefetch trace` on tiny random checkpoints of every supported
family: the greedy text equals the run's without prefetch, and the recall lookahead records
equals an independent computation from the hidden states plain transformers captures
(test_hf_lookahead.py's)."""

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


def _run(recipe, monkeypatch, capsys, prefetch: str, guesses: int = 2, fit=None) -> dict:
    monkeypatch.setenv("HOTSPLIT_PREFETCH", prefetch)
    monkeypatch.setenv("HOTSPLIT_PREFETCH_GUESSES", str(guesses))
    monkeypatch.setenv("HOTSPLIT_PREFETCH_SLOTS", "2")
    code = main(["run", str(recipe), "--json", *(["--prefetch-fit", str(fit)] if fit else [])])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _fit_trace(ckpt, prompts, tmp_path, capsys):
    """A routing trace of the checkpoint on other prompts (`balance --model --trace`)."""
    fit = tmp_path / "fit.npz"
    code = main(["balance", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "4", "--trace",
                 str(fit), "-o", str(tmp_path / "fit.hist.json")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return fit


def _prompts(tmp_path, n: int):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(orjson.dumps({"prompt": s}).decode() + "\n" for s in SENTENCES[:n]))
    return prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_text_is_the_same_with_lookahead_or_trace_staging(checkpoints, family, tmp_path, monkeypatch, capsys):
    ckpt = checkpoints[family]
    recipe = _recipe(tmp_path, ckpt, _prompts(tmp_path, 2), 5, _geometry(ckpt))
    other = tmp_path / "other.txt"
    other.write_text("\n".join(SENTENCES[2:5]) + "\n")
    off = _run(recipe, monkeypatch, capsys, "off")
    assert off["summary"].get("prefetch") is None and all(off["texts"])
    runs = {"lookahead": _run(recipe, monkeypatch, capsys, "lookahead"),
            "trace": _run(recipe, monkeypatch, capsys, "trace", fit=_fit_trace(ckpt, other, tmp_path, capsys))}
    for mode, on in runs.items():
        assert on["texts"] == off["texts"], mode
        p = on["summary"]["prefetch"]
        assert p["predictor"] == ("lookahead" if mode == "lookahead" else "cooccur") and p["slots"] == 2
        assert p["prefetched"] >= p["useful"] > 0 and p["staged_hits"] > 0, mode  # staged experts were read
        assert on["plan"]["hot_experts"] == off["plan"]["hot_experts"] - 2  # 2 shared slots carved from the budget
    assert runs["trace"]["summary"]["prefetch"]["fit"] == str(tmp_path / "fit.npz")


def test_trace_staging_on_a_checkpoint_needs_its_fit_and_writes_nothing_without(checkpoints, tmp_path, cli):
    ckpt = checkpoints["qwen2_moe"]
    recipe = _recipe(tmp_path, ckpt, _prompts(tmp_path, 1), 5, _geometry(ckpt))
    log = tmp_path / "log.jsonl"
    r = cli("run", recipe, "--prefetch", "trace", "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == ["error: prefetch trace (--prefetch) on a checkpoint stages with a table fitted on a "
                                  "routing trace of it: --prefetch-fit is missing; record one with `hotsplit balance "
                                  "--model DIR --prompts FILE --trace FIT.npz`"]


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


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
def test_each_layer_reads_its_staged_experts_from_their_rows(checkpoints, family, tmp_path, monkeypatch):
    """Each MoE layer's experts read their staged experts through the map, from rows past the hot
    slots holding their cold blobs; the hit rate counts those reads (hot or staged) and no
    staged expert is hot or outlives its step."""
    import math

    import torch
    from hotsplit_runtime.hf.run import checkpoint_prompts, prepare_checkpoint

    from hotsplit_cli.config.knobs import resolve_knobs
    from hotsplit_cli.config.recipe import load_recipe

    ckpt = checkpoints[family]
    rec = load_recipe(_recipe(tmp_path, ckpt, _prompts(tmp_path, 2), 5, _geometry(ckpt)))
    knobs = resolve_knobs(rec.knobs, {"HOTSPLIT_PREFETCH": "lookahead", "HOTSPLIT_PREFETCH_GUESSES": "3",
                                      "HOTSPLIT_PREFETCH_SLOTS": "2", "HOTSPLIT_DYNAMIC": "0"})
    built = prepare_checkpoint(rec, knobs, checkpoint_prompts(rec))
    banks, reads = built.engine.model.banks, []
    # a shared pool's rows are held in every predicted layer's bank, and the run says so
    assert any(n.startswith("prefetch_pool shared: ") for n in built.notes) == (len(banks) > 2)
    for bank in banks:
        def reading(experts, x, ids, w, host=False, bank=bank, forward=bank.forward):
            out = forward(experts, x, ids, w, host)
            for row, e in enumerate(bank.staged, start=bank.table.num_slots):
                assert bank.served_E[e] == row and not bank.table.hot_E[e]
                assert torch.equal(bank.hot_SB[row], bank.cold_EB[e])
            reads.append(len(bank.staged))
            return out
        bank.forward = reading
    s = built.engine.run(math.inf)
    assert max(reads) == 2 and sum(reads) == s.prefetch["prefetched"]
    assert s.hit_rate >= s.prefetch["staged_hit_rate"] > 0
    assert all(b.staged == [] for b in banks)
