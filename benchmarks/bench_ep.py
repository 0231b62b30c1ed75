"""Expert parallelism side by side: the tiny-ep4 model on 1, 2 and 4 ranks in one run.

    .venv/bin/python benchmarks/bench_ep.py [--steps 40] [--p2p-gbps 450]

For each ep the same recipe (each rank steps 16 tokens, the same per-rank hot budget) runs as
`hotsplit run --json`; the table gives the step time (the slowest rank's wall time / steps),
the exchange's activation bytes per layer and rank, measured next to the ledger's All-to-All
prediction, the time inside the collectives, and the balancedness. Then ep 4 runs again with a
live rebalance every steps/2 steps: its bytes and time, next to what moving the same bytes
GPU to GPU would take at --p2p-gbps (default 450 GB/s, NVLink 4 one way, the ledger's default
link). Only the all_to_all_single exchange is built (no all-gather mode to compare). On a CPU
the ranks share the cores: step times compare the modes on this machine, not a GPU box.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--p2p-gbps", type=float, default=450.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"tiny-ep4's model on 1, 2, 4 ranks, {args.steps} steps, 16 tokens per rank and step (CPU, gloo)")
        print(f"{'ep':>3} {'step ms':>8} {'hit rate':>9} {'balance':>8} {'a2a KiB/layer':>14} {'ledger KiB':>11}"
              f" {'a2a ms/layer':>13}")
        base = None
        for ep in (1, 2, 4):
            s = _run(_recipe(folder, ep), args.steps)
            step_ms = s["elapsed_s"] / s["steps"] * 1e3
            base = base or step_ms
            ex = s.get("exchange")
            a2a = f"{ex['measured_bytes_per_layer'] / 1024:14.1f} {ex['predicted_bytes_per_layer'] / 1024:11.1f}" \
                  f" {ex['ms_per_layer']:13.2f}" if ex else f"{'-':>14} {'-':>11} {'-':>13}"
            bal = f"{s['balancedness']:8.3f}" if "balancedness" in s else f"{'-':>8}"
            print(f"{ep:>3} {step_ms:8.1f} {100 * s['hit_rate']:8.1f}% {bal} {a2a}   ({step_ms / base:.2f}x ep 1)")
        s = _run(_recipe(folder, 4), args.steps, "--eplb-steps", str(max(1, args.steps // 2)))
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
