"""One rule for every output: the extension names the format written; any other is refused
before any work, with nothing written (was: `--plot x.txt` wrote a PNG named .txt)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("args, flag, name, want", [
    (("run", "tiny", "--steps", "2", "--plot"), "--plot", "hit.txt", ".png"),
    (("hist", "show", "examples/hist-tiny.json", "--plot"), "--plot", "cov.jpg", ".png"),
    (("balance", "tiny", "--steps", "2", "--trace"), "--trace", "tr.txt", ".npz"),
    (("run", "tiny", "--steps", "2", "--log-jsonl"), "--log-jsonl", "log.json", ".jsonl"),
    (("plan", "examples/hist-tiny.json", "--recipe", "tiny", "-o"), "--output", "plan.txt", ".json"),
])
def test_an_output_named_for_another_format_is_refused(cli, tmp_path, args, flag, name, want):
    r = cli(*args, tmp_path / name)
    assert r.code == 2 and r.out == ""
    assert r.err.startswith(f"error: {flag} {tmp_path / name}: must end in {want}"), r.err
    assert f"name it {(tmp_path / name).with_suffix(want).name}" in r.err
    assert list(tmp_path.iterdir()) == []
