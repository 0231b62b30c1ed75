"""`run` refuses to stage experts until the runtime can, instead of ignoring the knob."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("mode", ["trace", "lookahead"])
def test_run_refuses_prefetch_it_cannot_do_and_writes_nothing(cli, tmp_path, monkeypatch, mode):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("HOTSPLIT_PREFETCH", mode)
    r = cli("run", "tiny", "--steps", "4", "--scale", "0.25", "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [f"error: HOTSPLIT_PREFETCH={mode}: the runtime does not stage experts yet; judge "
                                  "prefetch with `hotsplit simulate --prefetch trace` and `hotsplit plan --platform`; "
                                  "run with prefetch off or auto"]
