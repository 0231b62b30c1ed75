"""benchmarks/bench_precision_replay.py on synthetic traces of the tiny recipe (the shared ESFT
traces are not needed): each row is what plan and simulate give for that plan file, the errors
are labelled made up, and an auto row keeps its error budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import load_trace, save_trace
from tests.conftest import load_benchmark


def test_rows_are_the_plans_replayed_at_their_stored_bytes(tmp_path, capsys):
    bench = load_benchmark("bench_precision_replay")
    m = load_recipe("tiny").model
    shares = zipf_shares(m.num_moe_layers, m.num_experts, 1.1, seed=0)
    fit, replay = (save_trace(tmp_path / f"{name}.npz", synthetic_trace(shares, m.moe_layer_ids, 48, 8, m.top_k,
                                                                         drift_every=16, seed=seed))
                   for name, seed in (("fit", 1), ("replay", 2)))
    rows = bench.rows_for(fit, replay, "tiny", 0.004, tmp_path)
    assert [r["name"] for r in rows] == ["native", "fp8", "mxfp4", "auto <= 0.02", "auto <= 0.05"]
    counts = load_trace(replay, 32).counts_SLE(32)
    for i, row in enumerate(rows):
        plan = json.loads((tmp_path / f"plan{i}.json").read_text())
        block = plan["precision"]
        sizes = np.full((4, 32), float(plan["expert_bytes"] or 0))
        hot = np.zeros((4, 32), dtype=bool)
        for j, layer in enumerate(range(1, 5)):
            for p, ids in block.get("by_layer", {}).get(str(layer), {}).items():
                sizes[j, ids] = block["expert_bytes"][p]
            hot[j, plan["ranks"][0]["hot"][str(layer)]] = True
        static = row["static"]
        assert static["hit_rate"] == pytest.approx(counts[:, hot].sum() / counts.sum(), rel=1e-12)
        want = (((counts > 0) & ~hot) * sizes).sum() / counts.shape[0]
        assert static["pcie_bytes_per_step"] == pytest.approx(want, rel=1e-12)
        if row["name"].startswith("auto"):
            assert row["expected_error"] <= float(row["name"].split()[-1]) + 1e-12
    assert rows[0]["static"]["pcie_bytes_per_step"] > rows[2]["static"]["pcie_bytes_per_step"]
    assert sum(r["dynamic"]["copies"] for r in rows) > 0  # the drift makes the dynamic rule swap
    capsys.readouterr()
    bench.print_table(rows, "tiny")
    out = capsys.readouterr().out
    assert "errors: MADE UP" in out and "1.00x" in out
    made_up = json.loads((tmp_path / "fit.hist.json").read_text())["quality"]["measured_on"]
    assert made_up.startswith("MADE UP")


def test_without_the_shared_traces_it_says_so(tmp_path, monkeypatch, capsys):
    bench = load_benchmark("bench_precision_replay")
    monkeypatch.setattr(bench, "DATA", tmp_path)
    assert bench.main() == 0
    assert "skipped: the shared ESFT traces are not in" in capsys.readouterr().out
