"""`run --plan` judges the plan's hit-rate predictions: achieved, predicted, band, WITHIN/OUTSIDE."""

import json

import numpy as np
import pytest

from hotsplit_cli.hotset.forecast import Band
from hotsplit_cli.hotset.verdict import hit_rate_verdicts
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace


def _trace_and_hist(tmp_path, seed):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=seed), (1, 2, 3, 4), steps=48, batch=16, top_k=4, seed=seed)
    trace = save_trace(tmp_path / f"t{seed}.npz", tr)
    counts = tr.counts_SLE(32)
    windows = counts.reshape(6, 8, 4, 32).sum(axis=1)
    hist = tmp_path / f"h{seed}.json"
    save_hist(hist, Histogram("tiny", "test trace", 4, int(counts.sum() // 4), (1, 2, 3, 4), windows.sum(0),
                              windows_WLE=windows, steps_per_window=8))
    return trace, hist


def test_a_run_on_its_fitted_trace_is_within_and_another_trace_is_outside(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    fitted, hist = _trace_and_hist(tmp_path, 3)
    other, _ = _trace_and_hist(tmp_path, 11)
    plan = tmp_path / "plan.json"
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    r = cli("run", "tiny", "--trace", fitted, "--plan", plan, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [v["verdict"] for v in doc["verdicts"]] == ["WITHIN", "WITHIN"]
    assert doc["verdicts"][0]["achieved"] == doc["summary"]["hit_rate"]
    r = cli("run", "tiny", "--trace", other, "--plan", plan)
    assert r.code == 0, r.err  # the exit code does not judge
    assert "hit rate (plan, in-sample): achieved" in r.out and ": OUTSIDE" in r.out


def test_bands_follow_the_held_out_spread():
    forecast = Band(0.50, 0.46, 0.54)
    inside, oos = hit_rate_verdicts(0.60, forecast, 0.58)
    assert (inside.low, inside.high, inside.word) == (pytest.approx(0.56), pytest.approx(0.64), "WITHIN")
    assert (oos.low, oos.high, oos.word) == (pytest.approx(0.46), pytest.approx(0.60), "WITHIN")
    assert [v.word for v in hit_rate_verdicts(0.60, forecast, 0.40)] == ["OUTSIDE", "OUTSIDE"]
    exact, = hit_rate_verdicts(0.60, None, 0.6000001)
    assert exact.word == "OUTSIDE" and hit_rate_verdicts(0.60, None, 0.60)[0].word == "WITHIN"
    assert hit_rate_verdicts(None, None, 0.5) == []
    assert np.isclose(hit_rate_verdicts(None, forecast, 0.5)[0].high, 0.54)
