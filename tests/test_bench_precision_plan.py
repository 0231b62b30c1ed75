"""benchmarks/bench_precision_plan.py: its replay counts bytes as `simulate --policies static`
does, and its auto rows move fewer bytes than every uniform precision within their error budget."""

from __future__ import annotations

import numpy as np
import pytest

from hotsplit_cli.analysis.simulate import run_static, summarise
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from tests.conftest import load_benchmark


def test_replay_counts_bytes_as_simulate_does():
    bench = load_benchmark("bench_precision_plan")
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.3, (12, 3, 8)).astype(float)
    hot = rng.random((3, 8)) < 0.4
    hit, nbytes = bench.replay(counts, hot, np.full((3, 8), 1000))
    s = summarise(run_static(counts, hot), counts.sum(axis=(1, 2)), 1000, 12)
    assert (hit, nbytes) == pytest.approx((s.hit_rate, s.pcie_bytes_per_step))
    sizes = rng.integers(1, 5, (3, 8)) * 100  # per-expert precisions: each cold expert touched at its bytes
    want = sum(sizes[(c > 0) & ~hot].sum() for c in counts) / 12
    assert bench.replay(counts, hot, sizes)[1] == pytest.approx(want)


def test_the_table_on_synthetic_traffic(monkeypatch, tmp_path, capsys):
    bench = load_benchmark("bench_precision_plan")
    monkeypatch.setattr(bench, "DATA", tmp_path)  # no shared data: synthetic traffic of the real shape
    monkeypatch.setattr(bench, "BUDGETS_GIB", {"deepseek-v2-lite": (1,)})
    rows, source = bench.rows_for("deepseek-v2-lite")
    assert source.startswith("synthetic")
    by_name = {name: (hit, mib, err) for _, name, hit, mib, _, err in rows}
    assert list(by_name) == ["native", "fp8", "mxfp4", "auto <= 0.02", "auto <= 0.05"]
    assert by_name["native"][1] > by_name["fp8"][1] > by_name["mxfp4"][1]
    for max_error in bench.MAX_ERRORS:
        hit, mib, err = by_name[f"auto <= {max_error:g}"]
        assert err <= max_error
        assert all(mib <= u[1] for n, u in by_name.items() if not n.startswith("auto") and u[2] <= max_error)
    bench.print_table("deepseek-v2-lite", rows, source)
    out = capsys.readouterr().out
    assert "auto <= 0.05" in out and "PCIe MiB/step" in out
    size = expert_bytes_per_rank(load_recipe("deepseek-v2-lite"), "mxfp4")
    assert size * 1664 > 2**30  # 1 GiB does not hold every mxfp4 expert: the rows differ
