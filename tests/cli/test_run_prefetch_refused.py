"""`run` refuses staging it cannot do instead of ignoring the knob, before anything is written."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("recipe, words", [
    ("tiny", "the trace predictor stages a synthetic model from a replayed trace, not traffic that is not a "
             "trace; run with --trace, or use prefetch lookahead"),
    ("tiny-ep4", "the runtime stages with the trace predictor on one rank, not ep 4; run with parallel.ep: 1, "
                 "stage with prefetch lookahead, or prefetch off"),
])
def test_run_refuses_trace_prefetch_it_cannot_do_and_writes_nothing(cli, tmp_path, monkeypatch, recipe, words):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("HOTSPLIT_PREFETCH", "trace")
    r = cli("run", recipe, "--steps", "4", "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [f"error: HOTSPLIT_PREFETCH=trace: {words}"]


def test_run_refuses_trace_staging_on_a_checkpoint_at_ep_2_before_loading_it(cli, tmp_path, checkpoints):
    pytest.importorskip("transformers", minversion="5.0")
    from tests.cli.test_run_ep_hf import _recipe

    log = tmp_path / "log.jsonl"
    recipe = _recipe(tmp_path, checkpoints["olmoe"], ["Hi"], 2)
    fit = tmp_path / "fit.npz"
    fit.write_bytes(b"")  # not read: the refusal comes first
    r = cli("run", recipe, "--prefetch", "trace", "--prefetch-fit", fit, "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == ["error: --prefetch=trace: the runtime stages with the trace predictor on one rank, "
                                  "not ep 2; run with parallel.ep: 1, stage with prefetch lookahead, or prefetch off"]


def test_run_stages_with_lookahead_and_says_so(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny", "--prefetch", "lookahead", "--prefetch-guesses", "6", "--steps", "4", "--scale", "0.25",
            "--log-jsonl", log)
    assert r.code == 0, r.err
    assert "router lookahead: recall " in r.out and "at 6 guesses per token" in r.out
    assert log.exists()
