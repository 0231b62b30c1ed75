"""`plan` prints and writes the hit rate it expects on traffic it has not seen (rolling origin),
next to the in-sample figure; per rank with a placement; older plan files still read."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.traffic.hist import Histogram, save_hist
from tests.conftest import make_hist

ROOT = Path(__file__).resolve().parents[2]
ONE = 3 * 256 * 128 * 2  # bytes of one tiny expert
# The shared routing records beside the checkout (../shared), or beside a worktree's parent folder.
ROUTING = next((p / "shared" / "data" / "routing" for p in ROOT.parents[:2] if (p / "shared").is_dir()),
               ROOT.parent / "shared" / "data" / "routing")


def _windowed(tmp_path, windows, name="h.json", model="tiny"):
    path = tmp_path / name
    hist = make_hist(windows.sum(0), layers=(1, 2, 3, 4), top_k=4, model=model)
    save_hist(path, replace(hist, windows_WLE=windows, steps_per_window=4))
    return path


def test_plan_prints_and_writes_both_figures(cli, tmp_path):
    windows = np.random.default_rng(5).gamma(0.5, 40.0, size=(6, 4, 32))
    hist, out = _windowed(tmp_path, windows), tmp_path / "plan.json"
    r = cli("plan", hist, "--recipe", "tiny", "--hot-gib", str(20 * ONE / 2**30), "-o", out)
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    held = doc["out_of_sample"]
    assert held["available"] and held["origins"] == [3, 4, 5]
    hits = []
    for k in (3, 4, 5):  # refit by hand: the 20 largest counts of windows [0, k), judged on window k
        fit = windows[:k].sum(0).ravel()
        hot = np.zeros(fit.size, dtype=bool)
        hot[np.argsort(-fit)[:20]] = True
        hits.append((windows[k].ravel() * hot).sum() / windows[k].sum())
    np.testing.assert_allclose(held["window_hit_rates"], hits, rtol=1e-12)
    assert held["low"] == pytest.approx(min(hits)) and held["high"] == pytest.approx(max(hits))
    assert f"hit rate {100 * doc['hit_rate']:.2f}% in-sample" in r.out
    assert (f"expected hit rate on new traffic {100 * held['expected']:.2f}%, range {100 * held['low']:.2f}-"
            f"{100 * held['high']:.2f}% (out-of-sample") in r.out
    plan = load_plan(out)
    assert plan.hit_rate == doc["hit_rate"] and plan.expected_hit_rate == held["expected"]
    assert plan.out_of_sample.contains(held["low"]) and not plan.out_of_sample.contains(held["high"] + 0.01)


def test_plan_without_windows_says_the_estimate_is_not_possible(cli, tiny_hist, tmp_path):
    out = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", out)
    assert r.code == 0, r.err
    assert "expected hit rate on new traffic: not estimated: the histogram has no windows" in r.out
    assert "balance --window-steps" in r.out
    assert json.loads(out.read_text())["out_of_sample"]["available"] is False
    assert load_plan(out).expected_hit_rate is None


def test_an_older_plan_without_the_forecast_still_reads(cli, tiny_hist, tmp_path):
    out = tmp_path / "plan.json"
    assert cli("plan", tiny_hist, "--recipe", "tiny", "-o", out).code == 0
    doc = json.loads(out.read_text())
    del doc["out_of_sample"]
    out.write_text(json.dumps(doc))
    plan = load_plan(out)
    assert plan.hit_rate == doc["hit_rate"] and plan.out_of_sample is None and plan.expected_hit_rate is None


def test_plan_on_a_placement_forecasts_each_rank(cli, tmp_path):
    import yaml

    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 2}
    recipe = tmp_path / "ep.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    hist = _windowed(tmp_path, np.random.default_rng(2).gamma(0.5, 40.0, size=(4, 4, 32)))
    placement = tmp_path / "placement.json"
    assert cli("place", hist, "--ranks", "2", "-o", placement, "--recipe", recipe).code == 0
    r = cli("plan", hist, "--recipe", recipe, "--placement", placement, "--hot-gib", str(6 * ONE / 2**30))
    assert r.code == 0, r.err
    assert "in-sample" in r.out and "new traffic" in r.out
    doc = json.loads(cli("plan", hist, "--recipe", recipe, "--placement", placement, "--hot-gib",
                         str(6 * ONE / 2**30), "--json").out)
    for rank in doc["ranks"]:
        band = rank["out_of_sample"]
        assert band["low"] <= band["expected"] <= band["high"]
        assert f"{100 * band['expected']:.1f}% ({100 * band['low']:.1f}-{100 * band['high']:.1f}%)" in r.out


@pytest.mark.skipif(not ROUTING.is_dir(), reason="the shared routing records are absent")
@pytest.mark.parametrize("task", ["intent", "law"])
def test_on_esft_the_range_contains_the_rate_on_held_out_windows(cli, tmp_path, task):
    """A plan fitted on the first 3/4 of a task's trace (16-step windows) forecasts the last 1/4."""
    from hotsplit_cli.traffic.trace import load_trace

    counts = load_trace(ROUTING / f"esft-v2lite-{task}.trace.npz", 64).counts_SLE(64)
    n_fit = counts.shape[0] * 3 // 4 // 16 * 16
    windows = counts[:n_fit].reshape(n_fit // 16, 16, 26, 64).sum(axis=1)
    path = tmp_path / "h.json"
    save_hist(path, Histogram("deepseek-ai/DeepSeek-V2-Lite", f"ESFT {task}, first {n_fit} steps", 6,
                              int(windows.sum() // 6), tuple(range(1, 27)), windows.sum(0), windows_WLE=windows,
                              steps_per_window=16))
    out = tmp_path / "plan.json"
    expert = 3 * 2048 * 1408 * 2
    hot_gib = str(416 * expert / 2**30)
    assert cli("plan", path, "--recipe", "deepseek-v2-lite", "--hot-gib", hot_gib, "-o", out).code == 0
    plan = load_plan(out)
    hot = plan.hot_LE(range(1, 27), 64)
    held = counts[n_fit:].sum(0)
    achieved = (held * hot).sum() / held.sum()
    assert plan.out_of_sample.contains(achieved), (plan.out_of_sample, achieved)
