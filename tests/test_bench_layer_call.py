"""benchmarks/bench_layer_call.py: a call's own cost is its time less its experts at the pool's
per-expert time of the same round (a fake clock makes every timed span one second)."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import load_benchmark


def test_the_own_cost_is_the_call_less_its_experts_at_the_pool_rate(monkeypatch, capsys):
    bench = load_benchmark("bench_layer_call")
    ticks = itertools.count()
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(ticks)))
    assert bench.main(["--calls", "2", "--rounds", "1", "--flush-mib", "1", "--experts", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = bench.POOL_BYTES // (3 * 256 * 128 * 4)  # tiny's experts: hidden 256, inter 128, float32
    assert f"pool {n} experts" in out[0]
    own = 1000.0 - 8 * 1000.0 / n  # each timed span is 1 s: a call 1000 ms, the pool 1000 ms / n per expert
    assert out[3] == f"| warm | 1000.000 (1000.000-1000.000) | {own:.3f} ({own:.3f}-{own:.3f}) |"
    assert out[4].startswith("| cold | 1000.000 (1000.000-1000.000) |")


def test_bad_counts_are_refused(capsys):
    bench = load_benchmark("bench_layer_call")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--experts", "0"])
    assert exc.value.code == 2 and "must be >= 1" in capsys.readouterr().err
