"""Simulate throughput on DeepSeek-V3 geometry: routed assignments replayed per second, per policy.

Geometry (deepseek-ai/DeepSeek-V3 config.json): 58 MoE layers (61 layers, first 3 dense),
256 routed experts, top-8; experts fp8 with 128x128 block scales, hidden 7168, moe_intermediate 2048.
Trace: synthetic Zipf(1.0) traffic with a hotspot move every 100 steps, 64 tokens per step.

Each policy is replayed once untimed, then ROUNDS times, the policies taking turns (round r starts with the r-th),
so that a change of load hits every policy alike: median simulate ms with its spread (min-max).
The hit rates and bytes are the same every round (a replay is deterministic).

Run: .venv/bin/python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import load_average, load_span, spread  # noqa: E402

from hotsplit_cli.analysis.simulate import POLICIES, SimConfig, simulate, summarise
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.hotset.sizes import FP8_BLOCK
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares

L, E, K, BATCH, STEPS = 58, 256, 8, 64, 400
HIDDEN, INTER = 7168, 2048
EXPERT_BYTES = 3 * HIDDEN * INTER + 3 * math.ceil(HIDDEN / FP8_BLOCK[0]) * math.ceil(INTER / FP8_BLOCK[1]) * 4
BUDGET_BYTES = 20 << 30  # 20 GiB of hot experts per rank
ROUNDS = 5


def main() -> None:
    t = time.perf_counter()
    trace = synthetic_trace(zipf_shares(L, E, 1.0, seed=0), range(L), STEPS, BATCH, K, drift_every=100, seed=0)
    gen_s = time.perf_counter() - t
    n = STEPS * L * BATCH * K
    t = time.perf_counter()
    counts = trace.counts_SLE(E)
    count_s = time.perf_counter() - t
    cfg = SimConfig(EXPERT_BYTES, BUDGET_BYTES, 50, 50, 2, 1.25)
    hot = plan_hot_set(counts[:50].sum(axis=0), EXPERT_BYTES, BUDGET_BYTES).hot_RLE[0]
    for name in POLICIES:  # warm-up: every policy once, untimed
        simulate(counts, hot, cfg, [name])
    load = load_average()
    ms: dict[str, list[float]] = {name: [] for name in POLICIES}
    summary = {}
    for r in range(ROUNDS):
        for name in POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]:
            t = time.perf_counter()
            run = simulate(counts, hot, cfg, [name])[name]
            ms[name].append((time.perf_counter() - t) * 1e3)
            s = summarise(run, counts.sum(axis=(1, 2)), EXPERT_BYTES, 50)
            first = summary.setdefault(name, s)
            if (first.hit_rate, first.pcie_bytes_per_step) != (s.hit_rate, s.pcie_bytes_per_step):
                raise SystemExit(f"error: {name} replayed differently in round {r}")
    print(f"{STEPS} steps x {L} layers x {BATCH} tokens x top-{K} = {n / 1e6:.1f} M routed assignments "
          f"(trace generated in {gen_s:.1f} s, counted in {count_s * 1e3:.0f} ms); {cfg.hot_slots} hot slots; "
          f"{ROUNDS} interleaved rounds, median (min-max); {load_span(load)}")
    print("| policy | simulate ms | M assignments / s (incl. counting) | hit rate | PCIe GiB / step |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in POLICIES:
        s, dt = summary[name], statistics.median(ms[name]) / 1e3
        print(f"| {name} | {spread(ms[name], '.0f')} | {n / (dt + count_s) / 1e6:.1f} | {100 * s.hit_rate:.2f}% "
              f"| {s.pcie_bytes_per_step / (1 << 30):.2f} |")


if __name__ == "__main__":
    main()
