"""`plan --precision native|fp8|mxfp4|auto [--max-error E]` and the stored bytes every other
command counts: the plan's precision block, its refusals (one line, nothing written), a plan
used at another precision, and the ESFT figures of the joint plan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.hist import Histogram, save_hist
from tests.planning.quality_fixture import quality_block

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "hist_quality_tiny.json"
ROUTING = ROOT.parent / "shared" / "data" / "routing"
MIB = 1 << 20


@pytest.fixture
def qhist(tmp_path):
    return Path(shutil.copy(FIXTURE, tmp_path / "h.json"))


def _plan(cli, hist, out, *args):
    return cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.005", "-o", out, *args)


def test_auto_plans_precisions_and_hot_set_together_and_records_them(cli, qhist, tmp_path):
    out = tmp_path / "plan.json"
    r = _plan(cli, qhist, out, "--precision", "auto", "--max-error", "0.03")
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    block = doc["precision"]
    assert block["knob"] == doc["knobs"]["precision"] == "auto" and doc["expert_bytes"] is None
    assert block["expected_error"] <= block["max_error"] == 0.03
    assert block["errors_from"].startswith("measured: test fixture")
    assert sum(n["hot"] + n["cold"] for n in block["experts"].values()) == 4 * 32
    hot = sum(n["hot"] for n in block["experts"].values())
    assert hot == doc["ranks"][0]["hot_experts"]
    assert doc["ranks"][0]["hot_bytes"] == sum(block["experts"][p]["hot"] * block["expert_bytes"][p]
                                               for p in block["experts"]) <= doc["budget_bytes"]
    assert doc["bound"]["pcie_bytes_per_step"] <= block["pcie_bytes_per_step"]
    assert doc["out_of_sample"]["available"]
    plan = load_plan(out)
    assert plan.precision == "auto"
    ids = sorted(e for groups in plan.precision_by_layer.values() for g in groups.values() for e in g)
    assert len(ids) == 4 * 32 and set(plan.precision_by_layer) == {1, 2, 3, 4}
    for word in ("precision", "hot experts", "cold experts", "PCIe", "expected error", "measured: test fixture",
                 "next-token agreement"):
        assert word in r.out


def test_a_uniform_precision_counts_its_stored_bytes(cli, qhist, tmp_path):
    out = tmp_path / "plan.json"
    assert _plan(cli, qhist, out, "--precision", "mxfp4").code == 0
    doc = json.loads(out.read_text())
    from hotsplit_cli.config.recipe import load_recipe

    size = expert_bytes_per_rank(load_recipe("tiny"), "mxfp4")
    assert doc["expert_bytes"] == size and doc["ranks"][0]["hot_experts"] == min(128, int(0.005 * 2**30) // size)
    assert doc["precision"]["expected_error"] > 0.05  # measured mxfp4 errors of the fixture


def test_without_measured_errors_a_uniform_precision_says_errors_unknown(cli, tiny_hist, tmp_path):
    r = _plan(cli, tiny_hist, tmp_path / "p.json", "--precision", "fp8")
    assert r.code == 0 and "errors unknown" in r.out and "hotsplit balance --model DIR --prompts FILE" in r.out
    assert json.loads((tmp_path / "p.json").read_text())["precision"]["expected_error"] is None


@pytest.mark.parametrize("hist, args, code, message", [
    ("plain", ("--precision", "auto", "--max-error", "0.02"), 1,
     "has no `quality` block; measure them with `hotsplit balance --model DIR --prompts FILE -o HIST`"),
    ("quality", ("--precision", "auto"), 2, "--precision auto needs --max-error E"),
    ("quality", ("--precision", "mxfp4", "--max-error", "0.01"), 1,
     "--max-error 0.01 is unreachable at mxfp4: its expected error is"),
    ("plain", ("--precision", "fp8", "--max-error", "0.01"), 1, "the errors of fp8 experts were not measured"),
    ("quality", ("--precision", "int4"), 2, "--precision: must be one of native, fp8, mxfp4, auto"),
])
def test_bad_precision_requests_are_one_line_and_write_nothing(cli, qhist, tiny_hist, tmp_path, hist, args, code,
                                                               message):
    out = tmp_path / "plan.json"
    r = _plan(cli, qhist if hist == "quality" else tiny_hist, out, *args)
    assert r.code == code and message in r.err, r.err
    assert r.err.count("\n") == 1 and r.err.startswith("error: ") and r.out == ""
    assert not out.exists()


def test_a_plan_made_at_one_precision_is_refused_at_another(cli, qhist, tmp_path, monkeypatch):
    plan = tmp_path / "plan.json"
    assert _plan(cli, qhist, plan, "--precision", "fp8").code == 0
    trace = tmp_path / "t.npz"
    r = cli("run", "tiny", "--plan", plan, "--steps", "2", "--json")
    assert r.code == 2 and "planned at precision fp8, but experts are stored at native (default)" in r.err
    assert "pass --precision fp8 (or HOTSPLIT_PRECISION=fp8)" in r.err and r.out == ""
    monkeypatch.setenv("HOTSPLIT_PRECISION", "mxfp4")
    rng = np.random.default_rng(0)
    np.savez(trace, topk_ids=rng.integers(0, 32, (4, 4, 8, 4)).astype(np.int16), layers=np.arange(1, 5))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--plan", plan, "--policies", "static",
            "--hot-gib", "0.005", "--plot", tmp_path / "x.png")
    assert r.code == 2 and "stored at mxfp4 (HOTSPLIT_PRECISION)" in r.err and not (tmp_path / "x.png").exists()


def test_simulate_counts_one_stored_precision_and_takes_auto_only_with_its_plan(cli, tmp_path):
    trace = tmp_path / "t.npz"
    rng = np.random.default_rng(0)
    np.savez(trace, topk_ids=rng.integers(0, 32, (8, 4, 8, 4)).astype(np.int16), layers=np.arange(1, 5))
    r = cli("simulate", "--trace", trace, "--recipe", "tiny", "--policies", "static", "--precision", "auto")
    assert r.code == 2 and "--precision auto: simulate replays the precisions an auto plan chose" in r.err
    docs = {p: json.loads(cli("simulate", "--trace", trace, "--recipe", "tiny", "--policies", "static",
                              "--hot-gib", "0.002", "--precision", p, "--json").out) for p in ("native", "mxfp4")}
    assert docs["mxfp4"]["budget"]["precision"] == "mxfp4"
    assert docs["mxfp4"]["budget"]["hot_slots"] > docs["native"]["budget"]["hot_slots"]


# --- the shared ESFT traces (skipped when the routing records are not beside the checkout) ---

def _esft_counts(task: str) -> np.ndarray:
    from hotsplit_cli.traffic.trace import load_trace

    return load_trace(ROUTING / f"esft-v2lite-{task}.trace.npz", 64).counts_SLE(64)


def _esft_hist(path: Path, counts_SLE: np.ndarray, task: str, steps_per_window: int | None = None) -> Path:
    windows = None
    if steps_per_window:
        n = counts_SLE.shape[0] // steps_per_window * steps_per_window
        windows = counts_SLE[:n].reshape(n // steps_per_window, steps_per_window, 26, 64).sum(axis=1)
        counts_SLE = counts_SLE[:n]
    counts = counts_SLE.sum(0)
    save_hist(path, Histogram("deepseek-ai/DeepSeek-V2-Lite", f"ESFT {task} (shared data)", 6,
                              int(counts.sum() // 6), tuple(range(1, 27)), counts, windows_WLE=windows,
                              steps_per_window=steps_per_window))
    return path


# DeepSeek-V2-Lite, a static plan fitted on ESFT intent and replayed on law: the table these
# figures were first derived in, by changing the recipe's expert_dtype. It gives hit rates cut to
# one decimal and MiB per step that differ from today's simulate by up to 1.8 MiB (0.08%) in three
# cells (4 GiB native and mxfp4, 2 GiB fp8) at every precision alike, so the table is checked
# within that, and the precision knob against the changed expert_dtype exactly.
ESFT_TABLE = {  # (hot GiB, precision): (hit rate %, PCIe MiB per step)
    (2, "native"): (7.5, 20103), (4, "native"): (14.9, 18461), (8, "native"): (29.6, 15128),
    (2, "fp8"): (14.9, 9233), (4, "fp8"): (29.6, 7566), (8, "fp8"): (59.8, 4168),
    (2, "mxfp4"): (27.7, 4125), (4, "mxfp4"): (56.2, 2431), (8, "mxfp4"): (100.0, 0),
}


def _static(cli, fit: Path, hot_gib: int, recipe: str, *args: str) -> dict:
    r = cli("simulate", "--trace", ROUTING / "esft-v2lite-law.trace.npz", "--recipe", recipe, "--hot-gib", hot_gib,
            "--fit", fit, "--policies", "static", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)["policies"]["static"]


@pytest.mark.skipif(not ROUTING.is_dir(), reason="the shared routing records are absent")
@pytest.mark.parametrize("precision", ["native", "fp8", "mxfp4"])
def test_simulate_reproduces_the_esft_table_at_each_precision(cli, tmp_path, precision):
    from hotsplit_cli.config.recipe import resolve_recipe_path

    fit = _esft_hist(tmp_path / "intent.json", _esft_counts("intent"), "intent")
    as_dtype = tmp_path / "v2.yaml"  # the recipe with its expert_dtype changed, as the table was derived
    text = resolve_recipe_path("deepseek-v2-lite").read_text()
    as_dtype.write_text(text.replace("expert_dtype: bf16", f"expert_dtype: {precision}")
                        if precision != "native" else text)
    for hot_gib in (2, 4, 8):
        static = _static(cli, fit, hot_gib, "deepseek-v2-lite", "--precision", precision)
        assert static == _static(cli, fit, hot_gib, str(as_dtype))
        hit, mib = ESFT_TABLE[(hot_gib, precision)]
        assert 100 * static["hit_rate"] == pytest.approx(hit, abs=0.1)
        assert static["pcie_bytes_per_step"] / MIB == pytest.approx(mib, abs=2.0)


@pytest.mark.skipif(not ROUTING.is_dir(), reason="the shared routing records are absent")
@pytest.mark.parametrize("task", ["intent", "law"])
def test_auto_on_esft_is_judged_out_of_sample_and_its_range_holds_the_held_out_rate(cli, tmp_path, task):
    """Fitted on the first 3/4 of a task (16-step windows, rolling origin), judged on the last 1/4."""
    counts = _esft_counts(task)
    n_fit = counts.shape[0] * 3 // 4 // 16 * 16
    path = _esft_hist(tmp_path / "h.json", counts[:n_fit], task, 16)
    doc = json.loads(path.read_text())
    doc["quality"] = quality_block(np.asarray(doc["counts"], dtype=float), seed=2)
    path.write_text(json.dumps(doc))
    out = tmp_path / "plan.json"
    r = cli("plan", path, "--recipe", "deepseek-v2-lite", "--hot-gib", "4", "--precision", "auto",
            "--max-error", "0.05", "-o", out)
    assert r.code == 0, r.err
    plan = load_plan(out)
    hot = plan.hot_LE(range(1, 27), 64)
    held = counts[n_fit:].sum(0)
    achieved = (held * hot).sum() / held.sum()
    assert plan.out_of_sample is not None and plan.out_of_sample.contains(achieved), (plan.out_of_sample, achieved)


def test_ledger_counts_the_stored_bytes_of_its_precision(cli):
    from hotsplit_cli.config.recipe import load_recipe

    docs = {p: json.loads(cli("ledger", "deepseek-v2-lite", "--precision", p, "--json").out)["memory"]
            for p in ("native", "fp8", "mxfp4")}
    rec = load_recipe("deepseek-v2-lite")
    for p, mem in docs.items():
        assert mem["precision"] == p and mem["expert_bytes"] == expert_bytes_per_rank(rec, p)
        assert mem["bank_bytes_per_rank"] == expert_bytes_per_rank(rec, p) * 64 * 26
    r = cli("ledger", "deepseek-v2-lite", "--precision", "fp8")
    assert "bf16 experts stored fp8" in r.out
    assert cli("ledger", "deepseek-v2-lite", "--precision", "auto").code == 2


def test_place_platform_times_ranks_at_the_stored_bytes(cli, tmp_path, monkeypatch):
    import yaml

    from tests.conftest import make_hist

    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 4}
    (tmp_path / "ep4.yaml").write_text(yaml.safe_dump(rec))
    (tmp_path / "pf.json").write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
        "host": {"numa_nodes": [{}], "copy_gbps": 20.0},
        "gpus": [{"index": 0, "mem_free_bytes": 1 << 30, "summary": {"zero_copy_read_gbps": 25.0}}]}))
    counts = np.random.default_rng(5).zipf(1.4, size=(4, 32)).clip(max=400).astype(float)
    save_hist(tmp_path / "h.json", make_hist(counts, layers=(1, 2, 3, 4), top_k=4, model="tiny"))

    def step_ms(precision: str) -> float:
        monkeypatch.setenv("HOTSPLIT_PRECISION", precision)
        r = cli("place", tmp_path / "h.json", "--recipe", tmp_path / "ep4.yaml", "--ranks", "4", "--platform",
                tmp_path / "pf.json", "--hot-gib", "0.002", "--json")
        assert r.code == 0, r.err
        return json.loads(r.out)["times"]["layouts"]["tokens"]["fitted"]["step_ms"]

    assert step_ms("mxfp4") < step_ms("fp8") < step_ms("native")


def test_auto_with_a_placement_is_refused_before_anything_is_read(cli, qhist, tmp_path):
    out = tmp_path / "plan.json"
    r = _plan(cli, qhist, out, "--precision", "auto", "--max-error", "0.05", "--placement", tmp_path / "none.json")
    assert r.code == 2 and "--precision auto plans the contiguous expert-parallel layout" in r.err
    assert not out.exists()


def test_mxfp4_of_a_shape_it_cannot_take_is_one_line_and_writes_nothing(cli, tmp_path):
    import yaml

    from tests.conftest import make_hist

    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["name"], rec["model"]["hidden_size"] = "tiny264", 264  # 264 inputs: not a multiple of 32
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rec))
    save_hist(tmp_path / "h.json", make_hist(np.ones((4, 32)), layers=(1, 2, 3, 4), top_k=4, model="tiny264"))
    out = tmp_path / "plan.json"
    r = cli("plan", tmp_path / "h.json", "--recipe", tmp_path / "r.yaml", "--hot-gib", "0.005",
            "--precision", "mxfp4", "-o", out)
    assert r.code == 1 and r.out == "" and not out.exists()
    assert r.err == ("error: mxfp4 needs input dims divisible by 32 (one scale per 32 inputs), but recipe 'tiny264' "
                     "has hidden_size = 264; store its experts at fp8 or native\n")
    assert cli("plan", tmp_path / "h.json", "--recipe", tmp_path / "r.yaml", "--hot-gib", "0.005",
               "--precision", "fp8", "-o", out).code == 0


def test_a_plan_at_a_stored_precision_runs_at_it_and_auto_runs_only_with_its_plan(cli, qhist, tmp_path):
    """A plan made at fp8 runs with --precision fp8 (its hot set fits the same budget); an auto
    plan runs with --precision auto, each expert at its precision, its hot bytes the plan's; auto
    without a plan is refused by `run` in one line before anything is built."""
    plan = tmp_path / "plan.json"
    assert _plan(cli, qhist, plan, "--precision", "fp8").code == 0
    r = cli("run", "tiny", "--plan", plan, "--precision", "fp8", "--steps", "2", "--scale", "0.25", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["knobs"]["precision"] == "fp8"
    auto = tmp_path / "auto.json"
    assert _plan(cli, qhist, auto, "--precision", "auto", "--max-error", "0.03").code == 0
    r = cli("run", "tiny", "--plan", auto, "--precision", "auto", "--steps", "2", "--scale", "0.25", "--json")
    assert r.code == 0, r.err
    doc, planned = json.loads(r.out), json.loads(auto.read_text())
    assert doc["knobs"]["precision"] == "auto" and doc["allocated"]["expert_format"].startswith("auto: ")
    assert doc["plan"]["hot_bytes"] == planned["ranks"][0]["hot_bytes"] and doc["plan"]["expert_bytes"] is None
    log = tmp_path / "run.jsonl"
    r = cli("run", "tiny", "--precision", "auto", "--steps", "2", "--log-jsonl", log)
    assert r.code == 2 and "--precision auto: run stores each expert at the precision an auto plan chose" in r.err
    assert len(r.err.strip().splitlines()) == 1 and not log.exists()
