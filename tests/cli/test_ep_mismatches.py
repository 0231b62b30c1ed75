"""Mismatches refused in one line before any work: `place --ranks` against an EP recipe's ep, a
negative --redundant (no warning about it first), and EP-only flags on a single-rank run."""

from pathlib import Path

import pytest

HIST = Path(__file__).resolve().parents[2] / "examples" / "hist-tiny.json"


def _refused(done, *words):
    assert done.code == 2, (done.out, done.err)
    lines = [x for x in done.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.err
    for w in words:
        assert w in lines[0], lines[0]


def test_place_ranks_other_than_the_recipes_ep_are_refused(cli, tmp_path):
    out = tmp_path / "pl.json"
    _refused(cli("place", HIST, "--recipe", "tiny-ep4", "--ranks", "8", "-o", out), "--ranks 8", "ep 4", "--ranks 4")
    assert not out.exists()


def test_a_negative_redundant_is_refused_without_a_warning_first(cli, tmp_path):
    out = tmp_path / "pl.json"
    done = cli("place", HIST, "--recipe", "tiny-ep4", "--ranks", "4", "--redundant", "-4", "-o", out)
    _refused(done, "--redundant must be >= 0, got -4")
    assert "warning" not in done.err and "-4 redundant" not in done.err and not out.exists()


@pytest.mark.parametrize("flags, env, words", [
    (["--eplb-steps", "5", "--ep-exchange", "allgather"], {}, ("--eplb-steps and --ep-exchange", "ep 1")),
    ([], {"HOTSPLIT_EPLB_STEPS": "5"}, ("HOTSPLIT_EPLB_STEPS", "ep 1")),
])
def test_ep_only_flags_on_a_single_rank_run_are_refused(cli, tmp_path, monkeypatch, flags, env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = tmp_path / "log.jsonl"
    done = cli("run", "tiny", "--steps", "2", "--log-jsonl", log, *flags)
    _refused(done, *words)
    assert not log.exists()
