"""benchmarks/bench_cpu_cold_rate.py, tiny: every contender is timed in its own process with the
others stopped, rounds take turns at who goes first, and the report's figures are the medians of
what each process answered."""

from __future__ import annotations

import json
import statistics

from tests.conftest import load_benchmark


class FakeChild:
    """A contender that answers from a script and records whether the others were stopped."""

    def __init__(self, name, log, others):
        self.name, self.log, self.others, self.stopped = name, log, others, True
        self.ready = {"read_bytes": {"1": 1e6, "4": 2e6}}

    def pause(self, stop):
        self.stopped = stop

    def ask(self, request):
        assert not self.stopped and all(c.stopped for c in self.others if c is not self)
        self.log.append(self.name)
        return {"ms": {str(b): float(len(self.log)) for b in request["batches"]}}


def test_each_contender_is_timed_alone_in_turn_and_reported_as_medians():
    bench = load_benchmark("bench_cpu_cold_rate")
    log, children = [], []
    children += [FakeChild(n, log, children) for n in bench.contenders(["native"])]
    ms = bench.measure(children, [1, 4], rounds=3)
    names = [c.name for c in children]
    assert log == names + names[1:] + names[:1] + names[2:] + names[:2]
    rows = bench.rows_of(bench.SHAPES["qwen3-30b-a3b"], children, ms, [1, 4])
    path = rows[0]["path:native"]
    answered = [float(i + 1) for i, n in enumerate(log) if n == "path:native"]  # each answer is the log's length
    assert path["ms_rounds"] == answered == [1.0, 8.0, 11.0] and path["ms"] == statistics.median(answered)
    assert path["gbps"] == 1e6 / path["ms"] / 1e6 and path["tokens_per_s"] == 1 / path["ms"] * 1e3
    torch_ms = min(rows[0][p]["ms"] for p in bench.PLAIN)
    assert rows[0]["path_vs_torch"] == path["ms"] / torch_ms
    assert rows[0]["path_vs_probe"] == path["ms"] / rows[0]["probe"]["ms"]
    # Within each round: path 1, 8, 11 against loop 2, 5, 12 and grouped_mm 3, 6, 9; the probe 4, 7, 10.
    assert rows[0]["round_path_vs_torch"] == {"median": 11 / 9, "min": 0.5, "max": 1.6, "rounds": [0.5, 1.6, 11 / 9]}
    assert rows[0]["round_path_vs_probe"] == {"median": 1.1, "min": 0.25, "max": 8 / 7, "rounds": [0.25, 8 / 7, 1.1]}
    doc = {"threads": 2, "scale": 1.0, "rounds": 3, "contenders": names, "rows": rows, "load": "load average 1"}
    native_line = next(line for line in bench.render(doc) if "| path:native |" in line)
    assert native_line.endswith("| 1.22 (0.50-1.60) | 1.10 (0.25-1.14) |")


def test_a_tiny_run_times_every_contender_in_its_own_process(capsys):
    bench = load_benchmark("bench_cpu_cold_rate")
    assert bench.main(["--models", "qwen3-30b-a3b", "--scale", "0.02", "--rounds", "1", "--batches", "2",
                       "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    for name in doc["contenders"]:
        assert row[name]["ms"] > 0 and len(row[name]["ms_rounds"]) == 1
    assert row["path_vs_torch"] > 0 and row["path_vs_probe"] > 0


def test_bad_arguments_are_refused_in_one_line(capsys):
    bench = load_benchmark("bench_cpu_cold_rate")
    assert bench.main(["--models", "mixtral"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: unknown model 'mixtral'")
