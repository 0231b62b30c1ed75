"""`run --plan` judges the plan's hit-rate predictions: achieved, predicted, band, WITHIN/OUTSIDE."""

import json

import numpy as np
import pytest

from hotsplit_cli.hotset.forecast import Band
from hotsplit_cli.hotset.verdict import Fit, hit_rate_verdicts
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import load_run_replay, save_trace


def _trace_and_hist(tmp_path, seed, windows=True):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=seed), (1, 2, 3, 4), steps=48, batch=16, top_k=4, seed=seed)
    trace = save_trace(tmp_path / f"t{seed}.npz", tr)
    counts = tr.counts_SLE(32)
    windows_WLE = counts.reshape(6, 8, 4, 32).sum(axis=1)
    hist = tmp_path / f"h{seed}{'w' * windows}.json"
    save_hist(hist, Histogram("tiny", "test trace", 4, int(counts.sum() // 4), (1, 2, 3, 4), windows_WLE.sum(0),
                              windows_WLE=windows_WLE if windows else None, steps_per_window=8 if windows else None))
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
    line = next(x for x in r.out.splitlines() if x.startswith("hit rate (plan, in-sample): achieved"))
    assert line.endswith(f"OUTSIDE: the run's traffic is not the histogram's (trace {other}, 48 of its 48 steps: "
                         "routing counts that differ from the histogram's): in-sample does not apply here")


def _verdicts(cli, *args):
    r = cli("run", "tiny", *args, "--json")
    assert r.code == 0, r.err
    return {v["name"]: v for v in json.loads(r.out)["verdicts"]}


def test_an_exact_band_is_kept_only_where_the_run_can_meet_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "0")
    fitted, hist = _trace_and_hist(tmp_path, 3, windows=False)  # no windows: the in-sample figure is exact
    plan = tmp_path / "plan.json"
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    same = _verdicts(cli, "--trace", fitted, "--plan", plan)["hit_rate.in_sample"]
    assert (same["verdict"], same["applies"], same["note"]) == ("WITHIN", True, None)
    assert same["low"] == same["high"] == same["predicted"] and same["band"] == "exact: no held-out windows"
    part = _verdicts(cli, "--trace", fitted, "--plan", plan, "--steps", "12")["hit_rate.in_sample"]
    assert (part["verdict"], part["low"], part["applies"]) == ("NO BAND", None, False)
    assert part["band"].startswith("no band: exact only on the routing the histogram counted")
    assert part["note"] == (f"the run replays part of the histogram's traffic (trace {fitted}, 12 of its 48 steps: "
                            "25% of the routed assignments the histogram counted): in-sample is for all of it")
    drawn = _verdicts(cli, "--plan", plan)["hit_rate.in_sample"]  # the recipe's synthetic traffic
    assert drawn["verdict"] == "NO BAND" and "(synthetic traffic of skew 1.1)" in drawn["note"]
    monkeypatch.setenv("HOTSPLIT_DYNAMIC", "1")
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "2")
    monkeypatch.setenv("HOTSPLIT_DYN_MARGIN", "1.0")
    swapped = _verdicts(cli, "--trace", fitted, "--plan", plan)["hit_rate.in_sample"]
    assert swapped["verdict"] == "NO BAND" and swapped["applies"]  # its traffic is the fit's, its hot set is not
    assert swapped["band"].endswith("swaps: the plan's hot set did not hold")


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


def test_a_band_of_no_width_is_a_figure_not_a_band():
    one_window = Band(0.50, 0.50, 0.50)  # one held-out window: no spread
    inside, oos = hit_rate_verdicts(0.48, one_window, 0.45, Fit(True, "trace t.npz"))
    assert (inside.band, inside.word) == ("exact: the held-out windows give no spread", "OUTSIDE")
    assert (oos.low, oos.high, oos.word) == (None, None, "NO BAND") and oos.band.startswith("no band: the held-out")
    _, full = hit_rate_verdicts(1.0, Band(1.0, 1.0, 1.0), 1.0)  # every held-out window fully hot: a band
    assert (full.low, full.high, full.word) == (1.0, 1.0, "WITHIN")
    other = Fit(False, "synthetic traffic of skew 1.1")
    (exact,) = hit_rate_verdicts(0.60, None, 0.60, other)  # equal by chance: still not a band it met
    assert exact.word == "NO BAND" and exact.note.endswith("in-sample does not apply here")
    banded, _ = hit_rate_verdicts(0.60, Band(0.50, 0.46, 0.54), 0.40, other)
    assert banded.word == "OUTSIDE" and banded.to_doc()["applies"] is False


def test_a_plan_whose_histogram_is_gone_is_not_judged_on_its_traffic(cli, tmp_path):
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.fitted_traffic import UNKNOWN, RunFits, run_fits
    from hotsplit_cli.hotset.planfile import load_plan

    fitted, hist = _trace_and_hist(tmp_path, 3)
    plan = tmp_path / "plan.json"
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    tiny = load_recipe("tiny")
    assert run_fits(load_plan(plan), tiny, load_run_replay(tiny, fitted, None)) == RunFits(Fit(True, f"trace {fitted}"))
    assert run_fits(None, tiny, load_run_replay(tiny, fitted, None)) == RunFits()
    hist.unlink()
    assert run_fits(load_plan(plan), tiny, load_run_replay(tiny, fitted, None)).hit_rate is UNKNOWN


def test_an_ep_plans_placement_is_judged_on_its_own_histogram(cli, tmp_path):
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.fitted_traffic import run_fits
    from hotsplit_cli.hotset.planfile import load_plan

    fitted, hist = _trace_and_hist(tmp_path, 3)
    _, other = _trace_and_hist(tmp_path, 11)
    placement, plan = tmp_path / "placement.json", tmp_path / "plan.json"
    assert cli("place", other, "--recipe", "tiny-ep4", "--ranks", "4", "-o", placement).code == 0
    assert cli("plan", hist, "--recipe", "tiny-ep4", "--placement", placement, "-o", plan).code == 0
    ep4 = load_recipe("tiny-ep4")
    fits = run_fits(load_plan(plan), ep4, load_run_replay(ep4, fitted, None))
    assert fits.hit_rate.same is True  # the plan's histogram is the trace's
    assert fits.balancedness.same is False and "differ from the histogram's" in fits.balancedness.traffic


def test_a_run_reads_its_trace_once(cli, tmp_path, monkeypatch):
    """The trace a run replays is read once, judged against the plan's histogram and replayed from that one read."""
    from hotsplit_cli.traffic import trace as trace_module

    fitted, hist = _trace_and_hist(tmp_path, 3)
    plan = tmp_path / "plan.json"
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "-o", plan).code == 0
    reads = []
    real = trace_module.load_trace
    monkeypatch.setattr(trace_module, "load_trace", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    r = cli("run", "tiny", "--trace", fitted, "--plan", plan, "--steps", "12", "--json")
    assert r.code == 0, r.err
    assert reads == [fitted]
    assert json.loads(r.out)["trace_steps"] == 48
