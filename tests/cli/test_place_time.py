"""`place --platform`: each rank's predicted time, the token- and time-balanced layouts side by
side, the same prediction as `plan --placement --platform`, and bad inputs refused up front."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hotsplit_cli.traffic.hist import save_hist
from tests.conftest import make_hist

ROOT = Path(__file__).resolve().parents[2]
ONE = 3 * 256 * 128 * 2  # bytes of one tiny expert (bf16)


@pytest.fixture
def ep4(tmp_path):
    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 4}
    path = tmp_path / "ep4.yaml"
    path.write_text(yaml.safe_dump(rec))
    return path


@pytest.fixture
def platform(tmp_path):
    path = tmp_path / "platform.json"
    path.write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
        "host": {"numa_nodes": [{}], "copy_gbps": 20.0},
        "gpus": [{"index": 0, "mem_free_bytes": 1 << 30, "summary": {"zero_copy_read_gbps": 25.0, "h2d_gbps": 25.0}}]}))
    return path


@pytest.fixture
def hists(tmp_path):
    rng = np.random.default_rng(5)
    fit = rng.zipf(1.4, size=(4, 32)).clip(max=400).astype(float)
    later = fit * rng.gamma(4, size=fit.shape) / 4
    paths = tmp_path / "fit.json", tmp_path / "later.json"
    for p, c in zip(paths, (fit, later), strict=True):
        save_hist(p, make_hist(c, layers=(1, 2, 3, 4), top_k=4, model="tiny"))
    return paths


def place(cli, hist, recipe, platform, out, *extra):
    return cli("place", hist, "--recipe", recipe, "--ranks", "4", "--redundant", "4", "--platform", platform,
               "--hot-gib", str(10 * ONE / 2**30), "-o", out, *extra)


def test_place_predicts_what_plan_placement_predicts_for_each_layout(cli, ep4, platform, hists, tmp_path):
    fit, later = hists
    for balance in ("tokens", "time"):
        out = tmp_path / f"{balance}.json"
        r = place(cli, fit, ep4, platform, out, "--balance", balance, "--eval", later, "--json")
        assert r.code == 0, r.err
        times = json.loads(r.out)["times"]
        assert times["chosen"] == balance and times["batch"] == 16 and times["read_gbps"] == 25.0
        r = cli("plan", fit, "--recipe", ep4, "--placement", out, "--platform", platform,
                "--hot-gib", str(10 * ONE / 2**30), "--json")
        assert r.code == 0, r.err
        plan = json.loads(r.out)
        row = next(t for t in plan["rank_times"] if t["batch"] == 16)
        want = times["layouts"][balance]["fitted"]
        assert row["step_ms"] == pytest.approx(want["step_ms"], rel=1e-12)
        assert row["rank_ms"] == pytest.approx(want["rank_ms"], rel=1e-12)
        rank0 = next(c for c in plan["decode_cost"] if c["batch"] == 16)
        assert rank0["cold_read_ms"] == pytest.approx(want["rank_ms"][0], rel=1e-12)  # one model for rank 0 too
        gpu = next(c for c in plan["cold_paths"]["by_batch"] if c["batch"] == 16)
        assert gpu["gpu_ms"] == pytest.approx(want["rank_ms"][0], rel=1e-9)  # and for its gpu cold path
    rows = times["layouts"]
    assert rows["time"]["fitted"]["step_ms"] <= rows["tokens"]["fitted"]["step_ms"]
    assert set(rows["time"]) == {"fitted", "eval"}


def test_place_time_table_and_golden_unchanged_without_platform(cli, ep4, platform, hists, tmp_path):
    fit, _ = hists
    r = place(cli, fit, ep4, platform, tmp_path / "p.json")
    assert r.code == 0, r.err
    assert "tokens" in r.out and "time (written)" in r.out and "max-rank ms/step" in r.out
    r = cli("place", fit, "--ranks", "4", "--redundant", "4", "--json")
    assert r.code == 0 and "times" not in json.loads(r.out)


@pytest.mark.parametrize("args, message", [
    (["--platform", "{platform}"], "error: --platform times each rank with the recipe's expert sizes and budget "
                                   "and needs --recipe; pass --recipe NAME (e.g. deepseek-v3-ep8)"),
    (["--platform", "{platform}", "--recipe", "{ep4}", "--balance", "speed"],
     "error: --balance: must be one of tokens, time, got 'speed'"),
    (["--hot-gib", "1"], "error: --hot-gib and --balance time the ranks and need --platform; pass --platform "
                         "platform.json from `hotsplit probe`"),
    (["--balance", "time"], "error: --hot-gib and --balance time the ranks and need --platform; pass --platform "
                            "platform.json from `hotsplit probe`"),
    (["--platform", "{platform}", "--recipe", "tiny"], "error: --platform times an expert-parallel layout of recipe "
                                                       "'tiny' (tp=1, ep=1) on --ranks 4; use a recipe with tp: 1 and "
                                                       "ep: 4 (e.g. deepseek-v3-ep8 with --ranks 8)"),
])
def test_bad_time_inputs_are_one_line_and_write_nothing(cli, ep4, platform, hists, tmp_path, args, message):
    out = tmp_path / "never.json"
    args = [a.format(platform=platform, ep4=ep4) for a in args]
    r = cli("place", hists[0], "--ranks", "4", "--redundant", "4", "-o", out, *args)
    assert r.code == 2, r.err
    assert r.err.strip() == message
    assert not out.exists()


def test_a_missing_platform_file_is_one_line_and_writes_nothing(cli, ep4, hists, tmp_path):
    out = tmp_path / "never.json"
    r = place(cli, hists[0], ep4, tmp_path / "absent.json", out)
    assert r.code == 1 and r.err.count("\n") == 1 and r.err.startswith("error: ")
    assert not out.exists()


def test_the_budget_knob_keeps_its_precedence_and_is_checked_first(cli, ep4, platform, hists, tmp_path, monkeypatch):
    out = tmp_path / "never.json"
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "abc")
    r = cli("place", hists[0], "--recipe", ep4, "--ranks", "4", "--redundant", "4", "--platform", platform, "-o", out)
    assert (r.code, r.err.strip()) == (2, "error: HOTSPLIT_HOT_GIB: must be a finite number, got 'abc'")
    assert not out.exists()
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", str(2 * ONE / 2**30))
    r = cli("place", hists[0], "--recipe", ep4, "--ranks", "4", "--redundant", "4", "--platform", platform, "--json")
    assert r.code == 0 and json.loads(r.out)["times"]["budget_source"] == "HOTSPLIT_HOT_GIB"
    r = place(cli, hists[0], ep4, platform, out, "--json")  # the flag beats the environment
    assert r.code == 0 and json.loads(r.out)["times"]["budget_bytes"] == int(10 * ONE / 2**30 * 2**30)


def test_place_platform_prints_a_small_budget_in_a_unit_that_shows_it(cli, ep4, platform, hists, tmp_path):
    """10 tiny experts are 1.88 MiB: the header must not round them to `0.00 GiB`."""
    r = place(cli, hists[0], ep4, platform, tmp_path / "pl.json", "--balance", "time")
    assert r.code == 0, r.err
    text = " ".join(r.out.split())  # the console may wrap the line
    assert "hot budget 1.88 MiB per rank" in text and "0.00 GiB" not in text, text
