"""EP predictions on real traffic fitted on other traffic: a static expert-parallel run achieves
exactly the balancedness and per-rank hit rates hotsplit predicts for the trace it replays.

    .venv/bin/python benchmarks/check_ep_predictions.py [--steps 64] [--ranks 4] [--hot-share 0.25]

Reads the ESFT DeepSeek-V2-Lite traces of ../shared/data/routing (from the repository root; the
script says so and stops when they are absent). For each (fit, replay) task pair and each
replica count: the histogram of the fit task's trace -> `place` -> `plan --placement` -> a static
`run --plan --trace` of the other task's trace on `--ranks` ranks (the deepseek-v2-lite recipe
with ep set, at its CPU scale). Each rank's hot budget is a `--hot-share` of the experts placed
on it (0.25: 416 of the model's 1,664 experts over all ranks, without replicas). Printed per
row: the plan's expected hit rate (on the fit task), the prediction for the replayed trace
(placement/dispatch.py's predict_trace: the same replica rule the ranks dispatch by), and what
the run achieved; the check fails unless prediction and run agree to 1e-12 on balancedness and
on every rank's hit rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROUTING = ROOT.parent / "shared" / "data" / "routing"
sys.path.insert(0, str(ROOT))

from hotsplit_cli.config.recipe import GIB, load_recipe  # noqa: E402
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank  # noqa: E402
from hotsplit_cli.traffic.hist import Histogram, save_hist  # noqa: E402
from hotsplit_cli.traffic.trace import load_trace  # noqa: E402

PAIRS = (("intent", "law"), ("law", "intent"))
NUM_EXPERTS = 64  # DeepSeek-V2-Lite: 64 routed experts, top-6 (recipes/deepseek-v2-lite.yaml)


def _hotsplit(*args: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "hotsplit_cli", *args], capture_output=True, text=True,
                          env=env or {**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"hotsplit {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def _recipe(folder: Path, ranks: int) -> Path:
    doc = yaml.safe_load((ROOT / "recipes" / "deepseek-v2-lite.yaml").read_text())
    doc["name"], doc["parallel"]["ep"], doc["parallel"]["tp"] = f"deepseek-v2-lite-ep{ranks}", ranks, 1
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _hist(task: str, folder: Path) -> Path:
    trace = load_trace(ROUTING / f"esft-v2lite-{task}.trace.npz", NUM_EXPERTS)
    counts = trace.counts_SLE(NUM_EXPERTS).sum(axis=0)
    top_k = trace.topk_ids_SLTK.shape[-1]
    path = folder / f"{task}-hist.json"
    save_hist(path, Histogram(model="deepseek-ai/DeepSeek-V2-Lite", source=f"ESFT {task} trace, all steps",
                              top_k=top_k, tokens=int(counts.sum() // top_k), layers=tuple(trace.layers),
                              counts_LE=counts))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=64, help="steps of the replayed trace to run (default 64)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hot-share", type=float, default=0.25, help="of the experts on a rank (default 0.25)")
    args = ap.parse_args()
    if not ROUTING.is_dir():
        print(f"skipped: {ROUTING} is absent (the shared routing records live beside the repository)")
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOTSPLIT_DYNAMIC": "0", "OMP_NUM_THREADS": "1"}
    worst = 0.0
    print(f"DeepSeek-V2-Lite, ep {args.ranks}, {args.steps} steps of the replayed trace, static hot sets")
    table = ("| fit -> replay | redundant | plan expects (fit) | predicted balancedness | achieved | "
             "predicted hit rate per rank | achieved |\n| --- | ---: | ---: | ---: | ---: | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        recipe = _recipe(d, args.ranks)
        rec = load_recipe(recipe)
        per_rank = rec.model.num_moe_layers * rec.model.num_experts // args.ranks
        hot_gib = f"{int(args.hot_share * per_rank) * expert_bytes_per_rank(rec) / GIB:.6f}"
        print(f"hot budget {hot_gib} GiB per rank: {int(args.hot_share * per_rank)} of its {per_rank} experts")
        print(table)
        for fit, replay in PAIRS:
            hist = _hist(fit, d)
            for redundant in (0, 2 * args.ranks):
                pl, plan = d / f"{fit}-pl{redundant}.json", d / f"{fit}-plan{redundant}.json"
                _hotsplit("place", str(hist), "--recipe", str(recipe), "--ranks", str(args.ranks),
                          "--redundant", str(redundant), "-o", str(pl))
                _hotsplit("plan", str(hist), "--recipe", str(recipe), "--placement", str(pl), "--hot-gib", hot_gib,
                          "-o", str(plan))
                run = json.loads(_hotsplit("run", str(recipe), "--plan", str(plan), "--trace",
                                           str(ROUTING / f"esft-v2lite-{replay}.trace.npz"), "--steps",
                                           str(args.steps), "--json", env=env))["summary"]
                expects = json.loads(plan.read_text())["hit_rate"]
                pred = [r["predicted_hit_rate"] for r in run["ranks"]]
                got = [r["hit_rate"] for r in run["ranks"]]
                gaps = [abs(run["balancedness"] - run["predicted_balancedness"])]
                gaps += [abs(a - b) for a, b in zip(pred, got, strict=True)]
                worst = max(worst, *gaps)
                print(f"| {fit} -> {replay} | {redundant} | {100 * expects:.2f}% | {run['predicted_balancedness']:.6f} "
                      f"| {run['balancedness']:.6f} | {' '.join(f'{100 * x:.2f}%' for x in pred)} "
                      f"| {' '.join(f'{100 * x:.2f}%' for x in got)} |")
    ok = worst <= 1e-12
    print(f"largest gap between prediction and run: {worst:.1e} ({'exact' if ok else 'MISMATCH'})")
    return 0 if ok else 1


if __name__ == "__main__":
    np.seterr(all="raise")
    sys.exit(main())
