"""A hotsplit file given where another kind is expected is named for what it is, with the command
that takes it (never a hint toward unsafe loading, never "truncated?")."""

from __future__ import annotations

import pytest


@pytest.fixture
def files(cli, tmp_path):
    hist, trace, plan = tmp_path / "h.json", tmp_path / "t.npz", tmp_path / "p.json"
    assert cli("balance", "tiny", "--steps", "4", "--trace", trace, "-o", hist).code == 0
    assert cli("plan", hist, "--recipe", "tiny", "-o", plan).code == 0
    return hist, trace, plan


def test_wrong_kinds_are_named_with_the_command_that_takes_them(cli, files, tmp_path):
    hist, trace, plan = files
    cases = [
        (("simulate", "--trace", hist, "--recipe", "tiny"),
         f"error: {hist}: is a hotsplit.hist file (`hotsplit plan HIST`, `hist show`, `simulate --fit` take it), not "
         f"a routing trace (.npz); capture a trace with `hotsplit balance RECIPE --trace FILE.npz`"),
        (("run", "tiny", "--trace", hist, "--steps", "2"), f"error: {hist}: is a hotsplit.hist file"),
        (("hist", "show", trace),
         f"error: {trace}: is a routing trace (.npz; `run --trace`, `simulate --trace` take it), not JSON; pass the "
         "file this option asks for"),
        (("plan", plan, "--recipe", "tiny"),
         f"error: {plan}: is a hotsplit.plan file (`run --plan`, `simulate --plan` take it), not a routing histogram"),
        (("simulate", "--trace", trace, "--recipe", "tiny", "--plan", hist),
         f"error: {hist}: is a hotsplit.hist file (`hotsplit plan HIST`, `hist show`, `simulate --fit` take it), not a "
         "hotsplit.plan file"),
    ]
    for args, message in cases:
        r = cli(*args)
        assert r.code == 1, (args, r.err)
        assert r.err.startswith(message), r.err
        assert "unsafely" not in r.err and "truncated" not in r.err
