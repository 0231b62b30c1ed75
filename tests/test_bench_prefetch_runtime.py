"""benchmarks/bench_prefetch_runtime.py: its two tables, every mode's row, on a couple of steps."""

from __future__ import annotations

from tests.conftest import load_benchmark


def test_tables_name_every_mode_and_lookahead_is_exact_on_the_models_own_routing(capsys):
    bench = load_benchmark("bench_prefetch_runtime")
    assert bench.main(["--steps", "3", "--rounds", "1", "--slots", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {(t, line.split()[0]): line.split() for t in ("trace replay", "own router")
            for line in lines[lines.index(next(x for x in lines if x.startswith(t))):][2:]
            if line.split() and line.split()[0] in ("off", "trace", "lookahead")}
    assert set(rows) >= {("trace replay", "off"), ("trace replay", "trace"), ("trace replay", "lookahead"),
                         ("own router", "off"), ("own router", "lookahead")}
    assert rows[("own router", "lookahead")][5] == "1.000"  # recall: the next router is what routes
    assert rows[("own router", "off")][-1] == "1.00x" and float(rows[("trace replay", "trace")][3]) > 0
