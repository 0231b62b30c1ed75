"""An EP `run --plan` judges every prediction it was given, on the shared ESFT traces: the plan's
hit rates and the placement's balancedness (in-sample and held-out), and each cold path's time.
A run on the trace the plan and placement were fitted on is WITHIN on every figure; on another
task's trace the in-sample figures are OUTSIDE (docs/simulate.md: why the held-out ones are too)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.trace import Trace, load_trace, save_trace
from tests.cli.test_plan_forecast import ROUTING
from tests.runtime.ep.harness import env_for_ranks, run_job, tiny_ep_recipe

HOTSPLIT = [sys.executable, "-m", "hotsplit_cli"]
STEPS, LAYERS, WINDOW = 24, 3, 4  # a few steps of the first MoE layers: the EP test stays tiny
ONE = 3 * 32 * 16 * 2  # bytes of one expert of the tiny EP recipe


def _ok(args, env=None):
    done = run_job([*HOTSPLIT, *map(str, args)], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _slice(task: str, d) -> tuple:
    """The task's first STEPS steps of its first LAYERS MoE layers, and their windowed histogram."""
    full = load_trace(ROUTING / f"esft-v2lite-{task}.trace.npz", 64)
    trace = Trace(full.topk_ids_SLTK[:STEPS, :LAYERS], tuple(range(1, LAYERS + 1)))
    path = save_trace(d / f"{task}.npz", trace)
    windows = trace.counts_SLE(64).reshape(STEPS // WINDOW, WINDOW, LAYERS, 64).sum(axis=1)
    hist = d / f"{task}.json"
    save_hist(hist, Histogram("tiny-ep-test", f"esft {task}", 6, STEPS * 32, trace.layers, windows.sum(0),
                              windows_WLE=windows, steps_per_window=WINDOW))
    return path, hist


@pytest.fixture(scope="module")
def esft(tmp_path_factory):
    if not ROUTING.is_dir():
        pytest.skip("the shared routing records are absent")
    d = tmp_path_factory.mktemp("ep-verdict")
    recipe = tiny_ep_recipe(d / "r.yaml", 2, **{"model.num_experts": 64, "model.top_k": 6,
                                                "model.num_hidden_layers": LAYERS + 1, "traffic.batch": 16,
                                                "hotsplit.hot_gib": 12 * ONE / 2**30, "model.total_params": 1.0e6})
    (intent, hist), (law, _) = _slice("intent", d), _slice("law", d)
    _ok(["place", hist, "--recipe", recipe, "--ranks", 2, "-o", d / "pl.json"])
    _ok(["plan", hist, "--recipe", recipe, "--placement", d / "pl.json", "-o", d / "plan.json"])
    env = env_for_ranks()
    env["HOTSPLIT_DYNAMIC"] = "0"
    runs = {name: json.loads(_ok(["run", recipe, "--plan", d / "plan.json", "--trace", trace, "--json"],
                                 env=env).stdout) for name, trace in (("fitted", intent), ("other", law))}
    env["HOTSPLIT_COLD_PATH"] = "cpu"
    runs["cpu"] = json.loads(_ok(["run", recipe, "--plan", d / "plan.json", "--trace", intent, "--steps", WINDOW,
                                  "--json"], env=env).stdout)
    return runs


def _by_name(doc) -> dict:
    return {v["name"]: v for v in doc["verdicts"]}


def test_on_the_fitted_trace_every_figure_is_within(esft):
    v = _by_name(esft["fitted"])
    assert {"hit_rate.in_sample", "hit_rate.out_of_sample", "balancedness.in_sample",
            "balancedness.out_of_sample"} <= set(v)
    assert all(x["verdict"] == "WITHIN" and x["within"] is True for x in v.values()), v
    s = esft["fitted"]["summary"]
    assert s["window_balancedness"]["steps_per_window"] == WINDOW
    assert v["balancedness.in_sample"]["achieved"] == s["window_balancedness"]["balancedness"]
    # the run's traffic is the fit's: the placement's in-sample figure is achieved exactly
    assert v["balancedness.in_sample"]["achieved"] == pytest.approx(v["balancedness.in_sample"]["predicted"],
                                                                    abs=1e-12)
    assert v["hit_rate.in_sample"]["achieved"] == pytest.approx(v["hit_rate.in_sample"]["predicted"], abs=1e-12)


def test_on_another_tasks_trace_the_in_sample_figures_are_outside(esft):
    v = _by_name(esft["other"])
    assert v["hit_rate.in_sample"]["verdict"] == v["balancedness.in_sample"]["verdict"] == "OUTSIDE"
    assert v["balancedness.in_sample"]["achieved"] < v["balancedness.in_sample"]["low"]
    assert np.isfinite(v["balancedness.out_of_sample"]["predicted"])


def test_each_ranks_cold_path_is_judged_by_its_own_rates_spread(esft):
    v = _by_name(esft["cpu"])
    for r in esft["cpu"]["summary"]["ranks"]:
        p = r["cold_paths"]["cpu"]
        judged = v[f"cold_path.cpu.rank.{r['rank']}"]
        assert judged["predicted"] == pytest.approx(p["predicted_ms"] / p["experts"])
        assert judged["high"] == pytest.approx(judged["predicted"] * (1 + p["spread"]))
        assert judged["within"] is (judged["low"] <= judged["achieved"] <= judged["high"])


def test_the_figures_docs_simulate_records_are_these_runs(esft):
    """docs/simulate.md's verdict table is what this module's runs give (rounded as printed there)."""
    fit, other = _by_name(esft["fitted"]), _by_name(esft["other"])
    hit_in, hit_out = fit["hit_rate.in_sample"], fit["hit_rate.out_of_sample"]
    bal_in, bal_out = fit["balancedness.in_sample"], fit["balancedness.out_of_sample"]
    assert [f"{100 * x:.2f}" for x in (hit_in["achieved"], hit_in["predicted"], hit_out["low"], hit_out["high"])] \
        == ["30.68", "30.68", "30.47", "30.86"]
    assert [f"{x:.4f}" for x in (bal_in["achieved"], bal_in["predicted"], bal_in["low"], bal_in["high"],
                                 bal_out["low"], bal_out["high"])] \
        == ["0.9788", "0.9788", "0.9639", "0.9936", "0.9600", "0.9897"]
    assert f"{100 * other['hit_rate.in_sample']['achieved']:.2f}" == "13.74"
    assert f"{other['balancedness.in_sample']['achieved']:.4f}" == "0.9531"
    assert {other[k]["verdict"] for k in ("hit_rate.in_sample", "hit_rate.out_of_sample", "balancedness.in_sample",
                                          "balancedness.out_of_sample")} == {"OUTSIDE"}
