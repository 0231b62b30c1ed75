"""benchmarks/bench_prefetch.py: skips cleanly without the shared traces, and its tables on a small pair."""

from __future__ import annotations

import numpy as np

from hotsplit_cli.traffic.predict import token_members_NLE
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from tests.conftest import load_benchmark


def test_without_the_shared_traces_it_says_so(monkeypatch, tmp_path, capsys):
    bench = load_benchmark("bench_prefetch")
    monkeypatch.setattr(bench, "DATA", tmp_path)
    assert bench.main() == 0
    assert capsys.readouterr().out.startswith(f"no shared routing traces at {tmp_path}")


def test_tables_on_a_small_pair(monkeypatch, capsys):
    bench = load_benchmark("bench_prefetch")
    monkeypatch.setattr(bench, "HOT_EXPERTS", 40)
    shares = zipf_shares(3, 64, 1.1, seed=0)
    fit, judge = (synthetic_trace(shares, (1, 2, 3), steps=6, batch=4, top_k=2, seed=s) for s in (0, 1))
    fit_NLE, judge_NLE = token_members_NLE(fit, 64), token_members_NLE(judge, 64)
    bench.predictor_table(fit_NLE, judge_NLE)
    bench.staging_table(fit_NLE, fit.counts_LE(64), judge.counts_SLE(64), judge_NLE, 1 << 20, 4)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["cooccur", "previous", "frequent"]
    rows = [line.split() for line in lines if line.startswith(("static", "dynamic"))]
    assert len(rows) == 12 and rows[0][:4] == ["static", "layer", "0", "40"]
    assert rows[1][3] == "38" and rows[4][3] == "36"  # 1 slot x 2 predicted layers; 4 shared
    assert np.isclose(float(rows[0][6]), 0.0)  # no slots, nothing wasted
