"""What `simulate` recommends for a trace (analysis/recommend.py): the judge, the candidates, the
command, and that `hotsplit run` does what the recommendation says."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hotsplit_cli.analysis.recommend import GRID_STEPS, GRID_SWAPS, Candidate, best, candidates, recommend
from hotsplit_cli.analysis.simulate import run_dynamic
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace


def cand(bytes_, hit, steps=8, rule="breakeven"):
    return Candidate(True, rule, steps, 2, hit, bytes_, 0)


def test_the_lowest_bytes_win_and_a_tie_goes_to_the_hit_rate_then_the_longer_window():
    static = Candidate(False, None, None, None, 0.5, 1000.0, 0)
    assert best([static, cand(990.0, 0.4)]) == cand(990.0, 0.4)  # bytes first, whatever the hit rate
    assert best([static, cand(1000.5, 0.6)]) == cand(1000.5, 0.6)  # within 0.1%: the hit rate decides
    assert best([static, cand(1002.0, 0.6)]) == static  # 0.2% more bytes is not a tie
    assert best([cand(900.0, 0.6, steps=4), cand(900.0, 0.6, steps=16)]) == cand(900.0, 0.6, steps=16)
    assert best([cand(900.0, 0.6, rule="credit"), cand(900.0, 0.6)]).dyn_rule == "credit"  # then the order


def _counts(steps=120):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps=steps, batch=16, top_k=4,
                         drift_every=40, seed=0)
    c = tr.counts_SLE(32)
    return c, plan_hot_set(c[:10].sum(axis=0), 100, 40 * 100).hot_RLE[0]


def test_candidates_are_static_then_every_rule_window_and_cap_as_simulate_replays_them():
    c, hot = _counts()
    k = resolve_knobs({}, {"HOTSPLIT_DYN_STEPS": "2000", "HOTSPLIT_DYN_MAX_SWAPS": "3"})
    cands = candidates(c, hot, 100, k)
    assert not cands[0].dynamic and cands[0].copies == 0
    grid = [(x.dyn_rule, x.dyn_steps, x.dyn_max_swaps) for x in cands[1:]]
    assert grid == [(r, s, m) for r in ("credit", "breakeven") for s in GRID_STEPS for m in sorted({*GRID_SWAPS, 3})]
    x = next(x for x in cands if (x.dyn_rule, x.dyn_steps, x.dyn_max_swaps) == ("breakeven", 8, 16))
    run = run_dynamic(c, hot, 8, 16, 1.25, rule="breakeven", sigmas=2.0)
    assert x.copies == run.copied_experts_S.sum() > 0
    assert x.hit_rate == pytest.approx(run.hits_S.sum() / c.sum(), rel=1e-12)
    assert x.pcie_bytes_per_step == pytest.approx(
        (run.cold_experts_S.sum() + run.copied_experts_S.sum()) * 100 / len(c), rel=1e-12)
    # A window as long as the trace is no candidate: it would never swap.
    assert all(x.dyn_steps < 20 for x in candidates(c[:20], hot, 100, k) if x.dynamic)


def test_every_candidate_replayed_is_counted_for_the_progress_bar():
    from hotsplit_cli.analysis.recommend import count_candidates

    c, hot = _counts()
    k = resolve_knobs({}, {"HOTSPLIT_DYN_MAX_SWAPS": "3"})
    ticks = []
    cands = candidates(c, hot, 100, k, ticks.append)
    assert len(ticks) == len(cands) == count_candidates(len(c), k) == 1 + 2 * len(GRID_STEPS) * 3


def test_the_command_starts_from_the_same_hot_set():
    c, hot = _counts(60)
    k = resolve_knobs({}, {})
    plan = recommend(c, hot, 100, k, "tiny", "t.npz", ("plan", "my plan.json"))
    assert plan.command.endswith("hotsplit run tiny --trace t.npz --plan 'my plan.json'") and plan.note is None
    fit = recommend(c, hot, 100, k, "tiny", "t.npz", ("fit", "h.json"), hot_gib_flag="0.5")
    assert fit.command.startswith("hotsplit plan h.json --recipe tiny --hot-gib 0.5 -o plan.json && ")
    assert fit.command.endswith("--trace t.npz --plan plan.json")
    window = recommend(c, hot, 100, k, "tiny", "t.npz", ("window", None), hot_gib_flag="0.5")
    assert window.command.endswith("--trace t.npz --hot-gib 0.5") and "whole trace" in window.note


HIST_QUALITY = Path(__file__).resolve().parents[1] / "data" / "hist_quality_tiny.json"


@pytest.mark.parametrize("precision", ["native", "fp8", "auto"])
def test_run_does_what_simulate_recommends(cli, tmp_path, tiny_hist, monkeypatch, precision):
    """The printed command and environment, given to `hotsplit run` with the same plan and trace,
    give the recommended hit rate, copies and PCIe bytes exactly; at a stored precision the command
    carries it (a run refuses a plan made at another), and under an auto plan each expert counts
    at its own stored bytes."""
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=3), (1, 2, 3, 4), steps=120, batch=16, top_k=4,
                         drift_every=40, seed=3)
    trace = save_trace(tmp_path / "trace.npz", tr)
    plan = tmp_path / "plan.json"
    flags = [] if precision == "native" else ["--precision", precision]
    hist, budget = (HIST_QUALITY, "0.005") if precision == "auto" else (tiny_hist, "0.004")
    extra = ["--max-error", "0.03"] if precision == "auto" else []
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", budget, *flags, *extra, "-o", plan).code == 0
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", plan, "--policies", "static", *flags, "--json")
    assert r.code == 0, r.err
    rec = json.loads(r.out)["recommendation"]
    assert rec["best"]["dynamic"] and rec["best"]["copies"] > 0 and len(rec["candidates"]) == 21  # tiny: dyn_steps 50
    words = shlex.split(rec["command"])
    env = dict(w.split("=", 1) for w in words if "=" in w and w.startswith("HOTSPLIT_"))
    assert env == rec["env"] and words[len(env):len(env) + 2] == ["hotsplit", "run"]
    assert (f"--precision {precision}" in rec["command"]) == (precision != "native")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = cli(*words[len(env) + 1:], "--json")  # after `hotsplit`
    assert run.code == 0, run.err
    summary = json.loads(run.out)["summary"]
    assert summary["swaps"] == rec["best"]["copies"]
    assert summary["hit_rate"] == pytest.approx(rec["best"]["hit_rate"], abs=1e-12)
    moved = summary["cold_bytes_per_step"] + summary["bytes_copied"] / summary["steps"]
    assert moved == pytest.approx(rec["best"]["pcie_bytes_per_step"], rel=1e-12)


def test_simulate_prints_the_recommendation_and_the_command(cli, tmp_path):
    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps=80, batch=16, top_k=4, seed=0)
    r = cli("simulate", "--trace", save_trace(tmp_path / "t.npz", tr), "--recipe", "tiny", "--policies", "static")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert any(x.startswith("recommended for this trace: ") for x in lines)
    run = next(x for x in lines if x.startswith("run it: "))
    assert "hotsplit run tiny --trace" in run and "HOTSPLIT_DYNAMIC=" in run
