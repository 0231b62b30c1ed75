"""`run` refuses staging it cannot do instead of ignoring the knob, before anything is written."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("mode, words", [
    ("lookahead", "error: HOTSPLIT_PREFETCH=lookahead: the runtime does not apply the next layer's router early "
                  "yet; stage with the trace predictor (prefetch trace) on a trace replay, or run with prefetch off"),
    ("trace", "error: HOTSPLIT_PREFETCH=trace: the runtime stages from a replayed trace on one rank of a synthetic "
              "model, not traffic that is not a trace; run a synthetic recipe with ep 1 and --trace, or with "
              "prefetch off"),
])
def test_run_refuses_prefetch_it_cannot_do_and_writes_nothing(cli, tmp_path, monkeypatch, mode, words):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("HOTSPLIT_PREFETCH", mode)
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [words]


def test_run_refuses_trace_prefetch_on_an_ep_recipe(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny-ep4", "--prefetch", "trace", "--steps", "4", "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == ["error: --prefetch=trace: the runtime stages from a replayed trace on one rank of "
                                  "a synthetic model, not ep 4; run a synthetic recipe with ep 1 and --trace, or "
                                  "with prefetch off"]
