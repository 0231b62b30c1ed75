"""Do the cold-path predictions say what happens? For a recipe, run the runtime under each cold
path (gpu, cpu, split) and compare, per path, the time it achieved with the time the cost model
predicted for the experts it computed, with the rates `run` itself uses (hotsplit_cli/hotset/
coldpath.py fit_rates: measured now on the allocated experts, or platform.json's when they fit).

    python benchmarks/bench_cold_agreement.py        # tiny, mixtral-8x7b at 1/16, deepseek-v2-lite at 1/16
    python benchmarks/bench_cold_agreement.py --recipe tiny --steps 100 --platform platform.json
    python benchmarks/bench_cold_agreement.py --clock cpu   # each thread's CPU time instead of the wall clock

Each mode is run `--rounds` times, interleaved with the others, each round with its own rates
measured at its start (as a run does); the table gives the median ratio achieved / predicted per
path and its range over the rounds. Target: every median ratio within 0.75..1.25 (25%). On a
GPU the device's time includes its hot experts, which the model does not time there; the device
row then says so. `gpu` mode runs through the same counters as the others (its split gives the
CPU nothing), so that its device time is measured and predicted alike.

`--clock cpu` times everything the run and its rate measurement time (probes/timing.py, the cold
paths' counters) by the CPU time of the thread doing it instead of the wall clock: what the same
work takes where no other process shares the cores. On a shared machine it shows the cost model's
own error apart from the load, which moves between the run's rate measurement (35 passes over a
64 MiB pool, runtime/cold_split.py CALIBRATION_POOL_BYTES) and the run itself; the wall clock is
what a user sees. The load average is printed per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotsplit_cli.config.knobs import resolve_knobs  # noqa: E402
from hotsplit_cli.config.recipe import load_recipe  # noqa: E402

MODES = ("gpu", "cpu", "split")
DEFAULT_CASES = (("tiny", 1.0, 200), ("mixtral-8x7b", 0.0625, 40), ("deepseek-v2-lite", 0.0625, 40))
TARGET = 0.25


def one_run(recipe: str, scale: float, steps: int, mode: str, platform: str | None) -> dict:
    """One run of `mode`: the per-path counters of its summary."""
    from hotsplit_runtime.device import tune_cpu_threads
    from hotsplit_runtime.from_recipe import prepare_run

    rec = load_recipe(recipe)
    knobs = resolve_knobs(rec.knobs, {}, {"cold_path": "cpu" if mode == "gpu" else mode, "dynamic": 0})
    prepared = prepare_run(rec, knobs, steps=steps, scale=scale, platform_path=platform)
    tune_cpu_threads(prepared.info)
    split = prepared.engine.model.compute.split
    split.mode = mode  # gpu: the same counters, the split giving the CPU nothing
    summary = prepared.engine.run(prepared.steps)
    split.close()
    return summary.cold_paths


def ratios(report: dict) -> dict:
    out = {}
    for path in ("gpu", "cpu"):
        p = report[path]
        if p["predicted_ms"] > 0 and p["experts"] + (p.get("hot_predicted_ms", 0) > 0) > 0:
            out[path] = {"achieved_ms": p["ms"], "predicted_ms": p["predicted_ms"],
                         "ratio": p["ms"] / p["predicted_ms"]}
    out["cpu_share"] = report["cpu_share"]
    out["rates"] = report["rates"]
    return out


def measure(recipe: str, scale: float, steps: int, rounds: int, platform: str | None) -> dict:
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:  # interleaved: a load change hits every mode alike
            runs[mode].append(ratios(one_run(recipe, scale, steps, mode, platform)))
    rows = []
    for mode in MODES:
        for path in ("gpu", "cpu"):
            got = [r[path] for r in runs[mode] if path in r]
            if not got:
                continue
            rs = [g["ratio"] for g in got]
            rows.append({"mode": mode, "path": "device" if path == "gpu" else "CPU",
                         "achieved_ms": statistics.median(g["achieved_ms"] for g in got),
                         "predicted_ms": statistics.median(g["predicted_ms"] for g in got),
                         "ratio": statistics.median(rs), "ratio_min": min(rs), "ratio_max": max(rs),
                         "cpu_share": statistics.median(r["cpu_share"] for r in runs[mode])})
    return {"recipe": recipe, "scale": scale, "steps": steps, "rounds": rounds,
            "load_average": [load_before, os.getloadavg()[0]], "rates": runs["split"][-1]["rates"], "rows": rows,
            "within_target": all(abs(r["ratio"] - 1) <= TARGET for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", help="one recipe (default: " + ", ".join(
        f"{r} at scale {s:g} for {n} steps" for r, s, n in DEFAULT_CASES) + ")")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--platform", help="platform.json (its rates are used where they fit the allocated experts)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall clock (default), or each thread's CPU time (time.thread_time)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        time.perf_counter = time.thread_time  # every timer the run and its rate measurement read
    os.environ.pop("HOTSPLIT_COLD_PATH", None)
    cases = ((args.recipe, args.scale, args.steps),) if args.recipe else DEFAULT_CASES
    docs = [measure(r, s, n, args.rounds, args.platform) for r, s, n in cases]
    if args.json:
        print(json.dumps(docs, indent=2))
    else:
        for d in docs:
            print(f"{d['recipe']} scale {d['scale']:g}, {d['steps']} steps x {d['rounds']} rounds, {args.clock} clock, "
                  f"load average {d['load_average'][0]:.1f} -> {d['load_average'][1]:.1f}; rates: {d['rates']}")
            print(f"{'mode':>5} {'path':>6} {'achieved ms':>12} {'predicted ms':>12} {'ratio':>6} {'range':>11} "
                  f"{'CPU share':>9}")
            for r in d["rows"]:
                print(f"{r['mode']:>5} {r['path']:>6} {r['achieved_ms']:>12.1f} {r['predicted_ms']:>12.1f} "
                      f"{r['ratio']:>6.2f} {r['ratio_min']:>5.2f}-{r['ratio_max']:<5.2f} {100 * r['cpu_share']:>8.0f}%")
            print(f"within {100 * TARGET:.0f}%: {'yes' if d['within_target'] else 'NO'}")
    return 0 if all(d["within_target"] for d in docs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
