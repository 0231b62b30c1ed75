"""Golden outputs of the commands on the shipped examples: plan, simulate, place, ledger (human and
--json) and run (--json, timings dropped). A change to any of them is deliberate or a bug; to
accept a deliberate one, regenerate with HOTSPLIT_GOLDEN=update and review the diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    path = GOLDEN / name
    if os.environ.get("HOTSPLIT_GOLDEN") == "update":
        path.write_text(text)
        return
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
