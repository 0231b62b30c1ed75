"""benchmarks/bench_cold_path.py on the CPU, tiny: the rounds interleave the three modes, and the
reported figures are the medians and spreads of what was timed (a fake clock hands them out)."""

from __future__ import annotations

import itertools
import json
import statistics

from tests.conftest import load_benchmark


def test_each_mode_is_timed_once_a_round_in_turn_and_reported_as_median_and_spread(monkeypatch, capsys):
    bench = load_benchmark("bench_cold_path")
    clock = itertools.count(1.0)  # every timed step takes 1 ms longer than the one before

    def fake_per_call_ms(fn, info):
        return float(next(clock))

    monkeypatch.setattr(bench, "per_call_ms", fake_per_call_ms)
    assert bench.main(["--scale", "0.02", "--rounds", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rounds"] == 3 and len(doc["load_average"]) == 2
    for i, row in enumerate(doc["rows"]):
        first = 9 * i + 1  # 3 rounds x 3 modes per batch, batches in turn
        # round r starts with mode r: gpu cpu split | cpu split gpu | split gpu cpu
        expect = {"gpu": [first, first + 5, first + 7], "cpu": [first + 1, first + 3, first + 8],
                  "split": [first + 2, first + 4, first + 6]}
        for mode, ms in expect.items():
            assert row[f"{mode}_ms_rounds"] == ms
            assert row[f"{mode}_ms"] == statistics.median(ms)
            pred = row[f"{mode}_predicted_ms"]
            assert pred > 0
            assert row[f"{mode}_vs_predicted"] == [statistics.median(ms) / pred, min(ms) / pred, max(ms) / pred]
        assert row["split_vs_gpu"] == row["split_ms"] / row["gpu_ms"]


def test_zero_rounds_is_refused_in_one_line(capsys):
    bench = load_benchmark("bench_cold_path")
    assert bench.main(["--scale", "0.02", "--rounds", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: --rounds must be at least 1\n"
