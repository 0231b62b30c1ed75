"""`run --prefetch trace` on a replayed trace: the staging counters in the summary, in each
window's record and in --json, under the names `simulate` uses."""

from __future__ import annotations

import json

import pytest

from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace

NAMES = {"prefetched", "useful", "wasted", "staged_hits", "copies", "cold_reads", "hit_rate", "staged_hit_rate",
         "useful_bytes_per_step", "wasted_bytes_per_step", "pcie_bytes_per_step"}


@pytest.fixture
def trace(tmp_path):
    return save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(4, 32, 1.2, 2), (1, 2, 3, 4), 16, 8, 4, seed=2))


def test_run_reports_the_staging_counters(cli, tmp_path, trace):
    log = tmp_path / "log.jsonl"
    args = ("run", "tiny", "--trace", trace, "--scale", "0.25", "--hot-gib", "0.0035", "--prefetch", "trace",
            "--prefetch-slots", "2", "--prefetch-fit", trace)
    r = cli(*args, "--json", "--log-jsonl", log)
    assert r.code == 0, r.err
    p = json.loads(r.out)["summary"]["prefetch"]
    assert NAMES <= set(p) and p["slots"] == 2 and p["pool"] == "shared" and p["fit"] == str(trace)
    assert p["prefetched"] == p["useful"] + p["wasted"] and p["useful"] > 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(rec["prefetch"]["prefetched"] for rec in records) == p["prefetched"]
    human = cli(*args)
    assert human.code == 0
    assert "2 staging slots (shared pool), 12 guesses per token, co-activation table fitted on" in human.out
    assert f"{p['prefetched']:,} experts: {p['useful']:,} useful, {p['wasted']:,} wasted" in human.out
    assert "hot, the rest staged)" in human.out
    first = records[0]["prefetch"]
    assert f"staged {first['prefetched']} ({first['useful']} read)" in human.err + human.out  # the window's line


@pytest.mark.parametrize("mode", ["off", "auto"])  # auto: what the plan plans, no staging while it plans none
def test_run_without_prefetch_reports_no_staging(cli, trace, mode):
    r = cli("run", "tiny", "--trace", trace, "--scale", "0.25", "--prefetch", mode, "--json")
    assert r.code == 0 and "prefetch" not in json.loads(r.out)["summary"]


@pytest.mark.parametrize("extra, words", [
    ((), "error: --prefetch-fit fits the predictor of prefetch trace, but prefetch is off (default); add --prefetch "
         "trace, or drop --prefetch-fit"),
    (("--prefetch", "trace"), "error: --prefetch-fit {missing}: no such file; give a routing trace (.npz) of the "
                              "same model"),
])
def test_prefetch_fit_is_refused_where_nothing_would_use_it(cli, tmp_path, trace, extra, words):
    log, missing = tmp_path / "log.jsonl", tmp_path / "none.npz"
    fit = trace if not extra else missing
    r = cli("run", "tiny", "--trace", trace, "--scale", "0.25", "--prefetch-fit", fit, *extra, "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.splitlines() == [words.format(missing=missing)]
