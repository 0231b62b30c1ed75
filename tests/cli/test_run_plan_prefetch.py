"""`run --plan` with a plan `plan --platform` made: a run that stages (prefetch lookahead) takes the
plan's staging slots, carved from the budget the plan's hot set was planned at, unless
--prefetch-slots says otherwise, and says so; a plan whose prefetch block is malformed is refused."""

from __future__ import annotations

import json

from hotsplit_cli.core.jsonio import write_json_atomic
from tests.planning.test_prefetch_compute import _with_lookahead, compute_at, platform_doc


def _plan(cli, tiny_hist, tmp_path, monkeypatch, prefetch: str):
    monkeypatch.setenv("HOTSPLIT_PREFETCH", prefetch)
    platform = write_json_atomic(tmp_path / "p.json", platform_doc(25.0, compute_at({1: 50.0, 256: 50.0})))
    out = tmp_path / f"plan-{prefetch}.json"
    r = cli("plan", _with_lookahead(tiny_hist, guesses=4), "--recipe", "tiny", "--platform", platform,
            "-o", out, "--json")
    assert r.code == 0, r.err
    return out, json.loads(out.read_text())


def _hot(doc) -> int:
    return sum(len(ids) for ids in doc["ranks"][0]["hot"].values())


def test_run_takes_the_plans_slots_carved_from_its_budget_and_says_so(cli, tiny_hist, tmp_path, monkeypatch):
    off, off_doc = _plan(cli, tiny_hist, tmp_path, monkeypatch, "off")
    path, doc = _plan(cli, tiny_hist, tmp_path, monkeypatch, "lookahead")
    slots, pool = doc["prefetch"]["slots"], doc["prefetch"]["pool"]
    assert slots > 0 and pool == "shared" and off_doc["prefetch"]["slots"] == slots
    assert _hot(doc) == _hot(off_doc) - slots  # planned at the budget less the slots a run stages with
    r = cli("run", "tiny", "--plan", path, "--prefetch", "lookahead", "--steps", "4", "--scale", "0.25", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["summary"]["prefetch"]["slots"] == slots
    assert f"prefetch_slots {slots} (shared pool) from the plan {path}, carved from its hot budget" in r.err
    r = cli("run", "tiny", "--plan", path, "--prefetch", "lookahead", "--prefetch-slots", "1", "--steps", "4",
            "--scale", "0.25", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["summary"]["prefetch"]["slots"] == 1 and "from the plan" not in r.err
    # A plan made with prefetch off keeps its whole budget hot: a staging run cannot carve from it.
    r = cli("run", "tiny", "--plan", off, "--prefetch", "lookahead", "--steps", "4", "--scale", "0.25")
    assert r.code == 1 and "fills the budget the staging slots are carved from" in r.err


def test_a_malformed_prefetch_block_is_refused_in_one_line_and_nothing_is_written(cli, tiny_hist, tmp_path,
                                                                                  monkeypatch):
    path, doc = _plan(cli, tiny_hist, tmp_path, monkeypatch, "lookahead")
    doc["prefetch"]["pool"] = "everywhere"
    path.write_text(json.dumps(doc))
    log = tmp_path / "log.jsonl"
    r = cli("run", "tiny", "--plan", path, "--prefetch", "lookahead", "--steps", "4", "--log-jsonl", log)
    assert r.code == 1 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [f"error: {path}: `prefetch` must hold `slots` (an int >= 0) and `pool` (layer or "
                                  "shared); re-create it with `hotsplit plan --platform`"]
