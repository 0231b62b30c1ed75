"""Golden outputs of the commands on the shipped examples: plan, simulate, place, ledger (human and
--json) and run (--json, timings dropped). A change to any of them is deliberate or a bug; to
accept a deliberate one, regenerate with HOTSPLIT_GOLDEN=update and review the diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
HIST = "examples/hist-tiny.json"
# What differs between machines or runs: timings, where memory landed, the device.
VOLATILE = {"elapsed_s", "tokens_per_s", "copy_ms", "ms", "predicted_ms", "numa", "device", "kernel", "created",
            "cold_bank_method", "cold_bank_fallback", "cold_bank_reserved_bytes", "rates", "hotsplit_version"}


def _scrub(doc, tmp: str):
    if isinstance(doc, dict):
        return {k: ("<volatile>" if k in VOLATILE else _scrub(v, tmp)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_scrub(v, tmp) for v in doc]
    if isinstance(doc, str):
        return doc.replace(tmp, "<tmp>")
    if isinstance(doc, float):
        return float(f"{doc:.10g}")
    return doc


@pytest.fixture
def trace(tmp_path):
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=3), (1, 2, 3, 4), steps=120, batch=16, top_k=4,
                         drift_every=40, seed=3)
    return save_trace(tmp_path / "trace.npz", tr)


CASES = {
    "plan": ["plan", HIST, "--recipe", "tiny"],
    "plan_budget": ["plan", HIST, "--recipe", "tiny", "--hot-gib", "0.004"],
    "simulate": ["simulate", "--trace", "{trace}", "--recipe", "tiny", "--hot-gib", "0.004"],
    "simulate_fit": ["simulate", "--trace", "{trace}", "--recipe", "tiny", "--fit", HIST, "--policies",
                     "static,dynamic,lru"],
    "place": ["place", HIST, "--ranks", "4", "--redundant", "4"],
    "ledger_tiny": ["ledger", "tiny", "--hist", HIST],
    "ledger_deepseek": ["ledger", "deepseek-v3", "--ep", "8"],
}


def _check(name: str, text: str) -> None:
    """Compare with the golden file; HOTSPLIT_GOLDEN=update rewrites it instead (refused under CI,
    where an update would make every snapshot pass) and reports a rewrite as a skip, not a pass."""
    path = GOLDEN / name
    if os.environ.get("HOTSPLIT_GOLDEN") == "update":
        if os.environ.get("CI"):
            pytest.fail("HOTSPLIT_GOLDEN=update is refused under CI (CI is set): it would rewrite the golden "
                        "files instead of checking them; update them locally and commit the reviewed diff")
        if path.exists() and path.read_text() == text:
            return
        path.write_text(text)
        pytest.skip(f"rewrote {path}: review the diff before committing it")
    assert path.exists(), f"no golden file {path}: run with HOTSPLIT_GOLDEN=update"
    assert text == path.read_text(), f"{name} changed; if deliberate: HOTSPLIT_GOLDEN=update pytest {__file__}"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["human", "json"])
def test_command_output_is_unchanged(cli, monkeypatch, trace, tmp_path, case, mode):
    monkeypatch.chdir(ROOT)
    for var in [v for v in os.environ if v.startswith("HOTSPLIT_") and v != "HOTSPLIT_GOLDEN"]:
        monkeypatch.delenv(var)
    args = [a.replace("{trace}", str(trace)) for a in CASES[case]] + (["--json"] if mode == "json" else [])
    r = cli(*args)
    assert r.code == 0, r.err
    if mode == "json":
        text = json.dumps(_scrub(json.loads(r.out), str(tmp_path)), indent=1, sort_keys=True) + "\n"
    else:
        text = r.out.replace(str(tmp_path), "<tmp>")
    _check(f"{case}.{mode}.txt", text)


def test_run_output_is_unchanged(cli, monkeypatch, trace, tmp_path):
    """A synthetic run replaying a trace under a static plan, then dynamic: the JSON without timings."""
    monkeypatch.chdir(ROOT)
    for var in [v for v in os.environ if v.startswith("HOTSPLIT_") and v != "HOTSPLIT_GOLDEN"]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOTSPLIT_DYN_STEPS", "30")
    r = cli("run", "tiny", "--trace", trace, "--hot-gib", "0.004", "--json")
    assert r.code == 0, r.err
    _check("run.json.txt", json.dumps(_scrub(json.loads(r.out), str(tmp_path)), indent=1, sort_keys=True) + "\n")


def test_golden_update_is_refused_under_ci(monkeypatch):
    path = GOLDEN / "plan.human.txt"
    before = path.read_bytes()
    monkeypatch.setenv("HOTSPLIT_GOLDEN", "update")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="HOTSPLIT_GOLDEN=update is refused under CI"):
        _check("plan.human.txt", "anything else\n")
    assert path.read_bytes() == before


def test_the_plan_golden_figures_follow_from_the_histogram_alone():
    """plan_budget's 62.19% and its 63.02% LP bound, worked out with plain numpy from the example
    histogram: equal expert sizes, so the plan takes the largest counts that fit, and the LP bound
    adds the fraction of the next one the leftover budget holds."""
    counts = np.asarray(json.loads((ROOT / HIST).read_text())["counts"], dtype=np.float64).ravel()
    one = 3 * 256 * 128 * 2  # recipes/tiny.yaml: hidden 256, moe_intermediate 128, bf16 gate/up/down
    budget = int(0.004 * 2**30)
    n, left = divmod(budget, one)
    top = np.sort(counts)[::-1]
    hit = top[:n].sum() / counts.sum()
    bound = (top[:n].sum() + left / one * top[n]) / counts.sum()
    assert (n, f"{100 * hit:.2f}%", f"{100 * bound:.2f}%") == (21, "62.19%", "63.02%")
    golden = json.loads((GOLDEN / "plan_budget.json.txt").read_text())
    assert golden["hit_rate"] == pytest.approx(hit, rel=1e-9)
    assert golden["bound"]["hit_rate"] == pytest.approx(bound, rel=1e-9)
    human = (GOLDEN / "plan_budget.human.txt").read_text()
    assert (f"hit rate {100 * hit:.2f}% in-sample (on the histogram it was fitted on), optimal (certified); "
            f"LP bound {100 * bound:.2f}%") in human
