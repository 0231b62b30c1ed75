"""`simulate` of an auto plan: each expert read and copied at the bytes of the precision the plan
chose for it, static and dynamic, with swaps that keep each expert's precision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.analysis.simulate import SimConfig, StoredPrecisions, run_dynamic, simulate, summarise

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "hist_quality_tiny.json"
SIZES = {"native": 100, "fp8": 50, "mxfp4": 25}  # bytes of one expert by hand


def _stored(names_LE, hot_LE) -> StoredPrecisions:
    names = np.asarray(names_LE, dtype=object)
    sizes = np.vectorize(SIZES.get, otypes=[np.int64])(names)
    return StoredPrecisions(names, sizes, int(np.sum(hot_LE)))


def _cfg(stored: StoredPrecisions, decay: float = 0.0) -> SimConfig:
    return SimConfig(None, 150, 2, 2, 1, 1.25, decay, "credit", stored=stored)


def test_static_reads_each_cold_expert_at_its_own_bytes_by_hand():
    # One layer: e0 native, e1 fp8, e2 mxfp4, e3 mxfp4; e0 and e2 hot (125 B of a 150 B budget).
    # step 0 routes e0, e1, e3 -> hits 1, cold e1 + e3 = 50 + 25 = 75 B
    # step 1 routes e1 twice, e2 -> hits 1, cold e1 = 50 B
    counts = np.array([[[1, 1, 0, 1]], [[0, 2, 1, 0]]], dtype=float)
    hot = np.array([[True, False, True, False]])
    stored = _stored([["native", "fp8", "mxfp4", "mxfp4"]], hot)
    run = simulate(counts, hot, _cfg(stored), ["static"])["static"]
    assert run.hits_S.tolist() == [1, 1] and run.cold_bytes_S.tolist() == [75, 50]
    s = summarise(run, counts.sum(axis=(1, 2)), None, 2)
    assert (s.hit_rate, s.pcie_bytes_per_step, s.copy_bytes_per_step) == (2 / 6, 62.5, 0.0)


def test_dynamic_swaps_keep_each_experts_precision_by_hand():
    # One layer: e0 fp8 hot, e1 fp8 cold, e2 mxfp4 hot, e3 native cold; windows of 2 steps, one
    # swap per window, decay 0 (the last window alone), margin 1.25.
    # steps 0-1: e0 5, e2 2     -> hits 7, nothing cold; no swap (e1 saw nothing)
    # steps 2-3: e1 5, e3 9, e2 2 -> hits 2, cold e1 + e3 = 150 B; e1 (fp8) in for e0 (fp8).
    #            e3 is busier, but no native expert is hot to make room for it at its own bytes.
    # steps 4-5: as 2-3          -> hits 7, cold e3 = 100 B; e1's copy, 50 B, lands at step 4
    counts = np.zeros((6, 1, 4))
    counts[0:2, 0, [0, 2]] = [5, 2]
    counts[2:6, 0, [1, 2, 3]] = [5, 2, 9]
    hot = np.array([[True, False, True, False]])
    stored = _stored([["fp8", "fp8", "mxfp4", "native"]], hot)
    run = simulate(counts, hot, _cfg(stored), ["dynamic"])["dynamic"]
    assert run.hits_S.tolist() == [7, 7, 2, 2, 7, 7]
    assert run.cold_bytes_S.tolist() == [0, 0, 150, 150, 100, 100]
    assert run.copied_bytes_S.tolist() == [0, 0, 0, 0, 50, 0] and run.copied_experts_S.tolist() == [0, 0, 0, 0, 1, 0]
    s = summarise(run, counts.sum(axis=(1, 2)), None, 2)
    assert s.hit_rate == pytest.approx(32 / 78) and s.pcie_bytes_per_step == pytest.approx(550 / 6)
    assert s.copy_bytes_per_step == pytest.approx(50 / 6) and s.copies == 1
    # Blind to precision, the rule would bring in e3 for e0 and miss e1 instead.
    blind = run_dynamic(counts, hot, dyn_steps=2, max_swaps=1, margin=1.25, decay=0.0)
    assert blind.hits_S.tolist() == [7, 7, 2, 2, 11, 11]


@pytest.mark.parametrize("rule", ["credit", "breakeven"])
def test_one_precision_everywhere_swaps_as_the_plain_rule_does(rule):
    rng = np.random.default_rng(3)
    counts = rng.poisson(rng.gamma(0.5, 2.0, (40, 3, 16)))
    counts[20:] = counts[20:, :, ::-1]  # the traffic moves: swaps happen
    hot = np.zeros((3, 16), dtype=bool)
    hot[:, :5] = True
    stored = _stored(np.full((3, 16), "fp8"), hot)
    cfg = SimConfig(None, 15 * 50, 4, 4, 2, 1.25, 0.8, rule, 0.5, stored)
    run = simulate(counts, hot, cfg, ["dynamic"])["dynamic"]
    plain = run_dynamic(counts, hot, 4, 2, 1.25, decay=0.8, rule=rule, sigmas=0.5)
    assert plain.copied_experts_S.sum() > 0
    assert run.hits_S.tolist() == plain.hits_S.tolist()
    assert run.copied_bytes_S.tolist() == (50 * plain.copied_experts_S).tolist()
    assert run.cold_bytes_S.tolist() == (50 * plain.cold_experts_S).tolist()


# --- the command ---

@pytest.fixture
def auto_plan(cli, tmp_path) -> Path:
    hist = Path(shutil.copy(FIXTURE, tmp_path / "h.json"))
    plan = tmp_path / "plan.json"
    r = cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.005", "--precision", "auto", "--max-error", "0.03",
            "-o", plan)
    assert r.code == 0, r.err
    return plan


@pytest.fixture
def trace(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "t.npz"
    np.savez(path, topk_ids=rng.integers(0, 32, (16, 4, 8, 4)).astype(np.int16), layers=np.arange(1, 5))
    return path


def test_simulate_of_an_auto_plan_counts_each_experts_stored_bytes(cli, auto_plan, trace):
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", auto_plan, "--precision", "auto", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc["policies"]) == {"static", "dynamic"}
    assert "--precision auto" in doc["recommendation"]["command"]  # the run: tests/planning/test_recommend.py
    # Worked out here from plan.json and the trace's ids with plain numpy.
    plan = json.loads(auto_plan.read_text())
    sizes = plan["precision"]["expert_bytes"]
    size_LE, hot_LE = np.zeros((4, 32)), np.zeros((4, 32), dtype=bool)
    for i, layer in enumerate(range(1, 5)):
        for p, ids in plan["precision"]["by_layer"][str(layer)].items():
            size_LE[i, ids] = sizes[p]
        hot_LE[i, plan["ranks"][0]["hot"][str(layer)]] = True
    ids = np.load(trace)["topk_ids"]
    counts = np.zeros((16, 4, 32))
    for s_ in range(16):
        for layer in range(4):
            np.add.at(counts[s_, layer], ids[s_, layer].ravel(), 1)
    static = doc["policies"]["static"]
    assert static["hit_rate"] == pytest.approx(counts[:, hot_LE].sum() / counts.sum(), rel=1e-12)
    cold_bytes = (((counts > 0) & ~hot_LE) * size_LE).sum() / 16
    assert static["pcie_bytes_per_step"] == pytest.approx(cold_bytes, rel=1e-12)
    native_bytes = ((counts > 0) & ~hot_LE).sum() * sizes["native"] / 16
    assert static["pcie_bytes_per_step"] < native_bytes  # not counted at native bytes
    assert doc["budget"]["precision"] == "auto" and doc["budget"]["expert_bytes"] is None
    assert doc["budget"]["hot_slots"] == int(hot_LE.sum())
    assert doc["budget"]["stored"] == {p: {"hot": n["hot"], "cold": n["cold"]}
                                       for p, n in plan["precision"]["experts"].items() if n["hot"] + n["cold"]}
    human = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", auto_plan, "--precision", "auto")
    assert human.code == 0 and "hot experts at the plan's precisions" in human.out
    assert "recommended for this trace" in human.out and "--precision auto" in human.out


@pytest.mark.parametrize("args, code, message", [
    (("--precision", "auto"), 2, "--precision auto: simulate replays the precisions an auto plan chose, and no "
     "--plan was given; pass --plan made with `hotsplit plan --precision auto --max-error E`"),
    (("--precision", "auto", "--plan", "PLAN", "--policies", "static,lru"), 2,
     "--policies lru: experts stored at an auto plan's precisions replay under static and dynamic only"),
    (("--precision", "auto", "--plan", "PLAN", "--prefetch", "trace"), 2,
     "prefetch trace: staging slots are sized for one stored precision"),
    (("--plan", "PLAN"), 2, "planned at precision auto, but experts are stored at native (default)"),
])
def test_bad_auto_requests_are_one_line_and_write_nothing(cli, auto_plan, trace, tmp_path, args, code, message):
    png = tmp_path / "never.png"
    args = tuple(str(auto_plan) if a == "PLAN" else a for a in args)
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plot", png, *args)
    assert r.code == code and message in r.err, r.err
    assert r.err.startswith("error: ") and r.err.count("\n") == 1 and r.out == ""
    assert not png.exists()


def test_the_cold_path_times_of_an_auto_plan_read_each_expert_at_its_bytes(cli, auto_plan, trace, tmp_path):
    platform = tmp_path / "pf.json"
    platform.write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
        "host": {"numa_nodes": [{}], "copy_gbps": 20.0},
        "gpus": [{"index": 0, "mem_free_bytes": 1 << 30, "summary": {"zero_copy_read_gbps": 25.0}}]}))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", auto_plan, "--precision", "auto",
            "--platform", platform, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    cold_ms = doc["policies"]["static"]["pcie_bytes_per_step"] / 25e9 * 1e3  # no sync cost measured: bytes / rate
    assert doc["policies"]["static"]["step_ms"] == pytest.approx(cold_ms, rel=1e-12)
    assert doc["cold_paths"]["gpu_ms"] == pytest.approx(cold_ms, rel=1e-9)
