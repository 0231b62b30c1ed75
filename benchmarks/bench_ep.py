"""Expert parallelism side by side: the tiny-ep4 model on 1, 2 and 4 ranks, and the two exchanges
(a2a: uneven all_to_all_single; allgather: all-gather, then reduce-scatter), in one run.

    .venv/bin/python benchmarks/bench_ep.py [--steps 40] [--repeats 3] [--p2p-gbps 450] [--collectives]

For each ep the same recipe (each rank steps 16 tokens, the same per-rank hot budget) runs as
`hotsplit run --json`, the runs of every (ep, exchange) interleaved `--repeats` times (medians
reported, so a slow moment of the machine touches every column alike). The table gives the step
time (the slowest rank's wall time / steps, against ep 1), the exchange's activation bytes per
layer and rank, measured next to the ledger's prediction for that exchange (All-to-All:
2 x tokens x top_k x hidden x act_bytes x (ep - 1) / ep; all-gather: 2 x tokens x hidden x
act_bytes x (ep - 1)), the time inside the collectives per layer next to the ledger's time for
those bytes at --p2p-gbps, and whether both exchanges gave the same loads and hit rates. Then
ep 4 runs again with a live rebalance every steps/2 steps: its bytes and time, next to what
moving the same bytes GPU to GPU would take at --p2p-gbps (default 450 GB/s, NVLink 4 one way,
the ledger's default link). On a CPU the ranks share the cores and gloo runs over loopback:
step and exchange times compare the modes on this machine, not on a GPU box. `--collectives`
first times each collective the two exchanges post, alone, at tiny-ep4's sizes (16 tokens of
256 float32 per rank, top_k 4) on 2 and 4 gloo ranks: what one exchange of each mode costs here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODES = ("a2a", "allgather")


def _recipe(folder: Path, ep: int) -> Path:
    doc = yaml.safe_load((ROOT / "recipes" / "tiny-ep4.yaml").read_text())
    doc["name"], doc["parallel"]["ep"] = f"tiny-ep{ep}", ep
    path = folder / f"tiny-ep{ep}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(recipe: Path, steps: int, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "hotsplit_cli", "run", str(recipe), "--json", "--steps", str(steps),
                           *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if done.returncode:
        sys.exit(f"{recipe.name}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)["summary"]


def _served(s: dict) -> list:
    """What both exchanges must agree on: each rank's load and hit rate, and the balancedness."""
    return [[(r["tokens"], r["hit_rate"]) for r in s["ranks"]], s["balancedness"]]


def _time_collectives() -> None:
    """One rank of `--collectives` (under torch.distributed.run): ms per call of each collective."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    R, T, H, K = dist.get_world_size(), 16, 256, 4
    x, x_all = torch.randn(T, H), torch.empty(R * T, H)
    rows, rows_out = torch.randn(T * K, H), torch.empty(T * K, H)  # a2a: every assignment's row, even split
    partial, out = torch.randn(R * T, H), torch.empty(T, H)
    route, routes = torch.zeros(T, 2 * K), torch.empty(R * T, 2 * K)
    counts, counts_out = torch.zeros(R, dtype=torch.int64), torch.empty(R, dtype=torch.int64)
    calls = {
        "a2a: counts all_to_all_single": lambda: dist.all_to_all_single(counts_out, counts),
        "a2a: rows all_to_all_single": lambda: dist.all_to_all_single(rows_out, rows),
        "allgather: routing all_gather_into_tensor": lambda: dist.all_gather_into_tensor(routes, route),
        "allgather: rows all_gather_into_tensor": lambda: dist.all_gather_into_tensor(x_all, x),
        "allgather: reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, partial),
        "(all_reduce of the same partials)": lambda: dist.all_reduce(partial),
    }
    for name, call in calls.items():
        for _ in range(10):
            call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        ms = (time.perf_counter() - t0) / 200 * 1e3
        if dist.get_rank() == 0:
            print(f"  ep {R}  {name:44s} {ms:6.3f} ms")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--p2p-gbps", type=float, default=450.0)
    ap.add_argument("--collectives", action="store_true")
    ap.add_argument("--collectives-rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 1:
        ap.error("--steps and --repeats must be >= 1")
    if args.collectives_rank:
        return _time_collectives()
    if args.collectives:
        print("each collective alone, ms per call (200 calls after 10 warm-up; gloo on loopback):")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for n in (2, 4):
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                            __file__, "--collectives-rank"], check=True, env=env, timeout=600,
                           stderr=subprocess.DEVNULL)
    configs = [(1, "a2a")] + [(ep, mode) for ep in (2, 4) for mode in MODES]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        recipes = {ep: _recipe(folder, ep) for ep in (1, 2, 4)}
        runs: dict = {c: [] for c in configs}
        for _ in range(args.repeats):
            for ep, mode in configs:
                runs[ep, mode].append(_run(recipes[ep], args.steps, "--ep-exchange", mode))
        print(f"tiny-ep4's model on 1, 2, 4 ranks, {args.steps} steps, 16 tokens per rank and step (CPU, gloo), "
              f"medians of {args.repeats} interleaved runs; ledger times at {args.p2p_gbps:g} GB/s")
        print(f"{'ep':>3} {'exchange':>9} {'step ms':>8} {'vs ep 1':>8} {'hit rate':>9} {'balance':>8} "
              f"{'KiB/layer':>10} {'ledger KiB':>11} {'ms/layer':>9} {'ledger ms':>10} {'same loads':>11}")
        base = statistics.median(s["elapsed_s"] / s["steps"] * 1e3 for s in runs[1, "a2a"])
        for ep, mode in configs:
            ss = runs[ep, mode]
            s = ss[0]
            step_ms = statistics.median(x["elapsed_s"] / x["steps"] * 1e3 for x in ss)
            row = (f"{ep:>3} {mode if ep > 1 else '-':>9} {step_ms:8.1f} {step_ms / base:7.2f}x "
                   f"{100 * s['hit_rate']:8.1f}%")
            if ep == 1:
                print(f"{row} {'-':>8} {'-':>10} {'-':>11} {'-':>9} {'-':>10} {'-':>11}")
                continue
            ex = s["exchange"]
            ms = statistics.median(x["exchange"]["ms_per_layer"] for x in ss)
            ledger_ms = ex["predicted_bytes_per_layer"] / (args.p2p_gbps * 1e9) * 1e3
            same = all(_served(x) == _served(runs[ep, "a2a"][0]) for x in ss)
            print(f"{row} {s['balancedness']:8.3f} {ex['measured_bytes_per_layer'] / 1024:10.1f} "
                  f"{ex['predicted_bytes_per_layer'] / 1024:11.1f} {ms:9.2f} {ledger_ms:10.4f} "
                  f"{'yes' if same else 'NO':>11}")
        s = _run(recipes[4], args.steps, "--eplb-steps", str(max(1, args.steps // 2)))
        for r in s["rebalances"]:
            if r["skipped"]:
                print(f"rebalance at step {r['step']}: skipped ({r['skipped']})")
                continue
            moved = sum(r["bytes_moved_R"])
            p2p_ms = moved / (args.p2p_gbps * 1e9) * 1e3
            print(f"rebalance at step {r['step']}: balancedness {r['before']:.3f} -> {r['predicted_after']:.3f} "
                  f"predicted, {r['achieved_after']:.3f} achieved; {r['experts_moved']} slots refilled from the "
                  f"shared cold bank, {moved / 2**20:.2f} MiB (real) in {r['ms']:.1f} ms on the ranks, "
                  f"{r['steps_disturbed']} steps disturbed; GPU to GPU the same bytes take {p2p_ms:.3f} ms at "
                  f"{args.p2p_gbps:g} GB/s, with every rank stopped while they move")


if __name__ == "__main__":
    main()
