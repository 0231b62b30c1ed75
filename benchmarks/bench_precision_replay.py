"""Stored precisions replayed by `hotsplit simulate`, static and dynamic: hit rate and PCIe MiB per
step of plans at native, fp8, mxfp4 and auto (two error budgets), side by side with native.

Traffic: the shared ESFT traces of DeepSeek-V2-Lite (`../shared/data/routing/esft-v2lite-{intent,
law}.trace.npz`, see that folder's README): each plan is made on the intent task's counts and
replayed on the law task, 32 tokens per step, at a 4 GiB hot budget. Without the traces the script
says so and exits.

Errors: MADE UP. No measured per-expert errors of DeepSeek-V2-Lite ship with hotsplit (they need
the checkpoint and `hotsplit balance --model`). The intent histogram gets a seeded synthetic
`quality` block (tests/planning/quality_fixture.py, seed 0): errors of the size fp8 / mxfp4
rounding gives, about 2% and 12%, varying 0.5-1.5x by expert. So the auto rows show how the
planner spends an error budget and what simulate then replays. They say nothing about the
model's quality.

Each row is what the commands do: `hotsplit plan FIT --recipe deepseek-v2-lite --hot-gib 4
--precision P [--max-error E]` (the recipe's own traffic.batch, 16, as a user would plan), then
`hotsplit simulate --trace LAW --recipe deepseek-v2-lite --plan plan.json --precision P
--policies static,dynamic --dyn-steps 16`. The recipe's dyn_steps (500) is longer than the
260-step trace, so at it no swap would happen and dynamic would equal static; 16 is one point of
the grid `simulate` recommends from, not tuned here, and the other dynamic knobs are the
recipe's. `vs native` is native's PCIe bytes per step over the row's, from the native run of the
same process.

Run: .venv/bin/python benchmarks/bench_precision_replay.py   (about 15 s on 2 cores)
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' quality fixture: the one generator of synthetic errors

from hotsplit_cli.cli import main as hotsplit  # noqa: E402
from hotsplit_cli.config.recipe import load_recipe  # noqa: E402
from hotsplit_cli.traffic.hist import Histogram, save_hist  # noqa: E402
from hotsplit_cli.traffic.trace import load_trace  # noqa: E402
from tests.planning.quality_fixture import quality_block  # noqa: E402

DATA = next((p / "shared" / "data" / "routing" for p in ROOT.parents[:2] if (p / "shared").is_dir()),
            ROOT.parent / "shared" / "data" / "routing")
MIB = 1 << 20
HOT_GIB = 4
PLANS = (("native", None), ("fp8", None), ("mxfp4", None), ("auto", 0.02), ("auto", 0.05))
ERROR_SEED = 0
DYN_STEPS = 16  # steps per swap window (docstring: why not the recipe's)


def run(*args) -> dict:
    """One hotsplit command in this process, its --json document."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = hotsplit([str(a) for a in (*args, "--json")])
    if code != 0:
        raise SystemExit(f"hotsplit {' '.join(map(str, args))} failed ({code})")
    return json.loads(out.getvalue())


def fit_hist(trace_path: Path, recipe_name: str, path: Path) -> Path:
    """The fit trace's counts as a histogram, with a seeded made-up `quality` block."""
    m = load_recipe(recipe_name).model
    trace = load_trace(trace_path, m.num_experts)
    counts = trace.counts_SLE(m.num_experts).sum(axis=0)
    save_hist(path, Histogram(m.name, f"{trace_path.name} (made-up errors)", m.top_k,
                              int(counts.sum() // m.top_k), tuple(trace.layers), counts))
    doc = json.loads(path.read_text())
    doc["quality"] = quality_block(counts, seed=ERROR_SEED)
    doc["quality"]["measured_on"] = "MADE UP: seeded synthetic errors (bench_precision_replay.py), not measured"
    path.write_text(json.dumps(doc))
    return path


def rows_for(fit_trace: Path, replay_trace: Path, recipe_name: str, hot_gib: float, workdir: Path) -> list[dict]:
    """One row per plan of PLANS: its expected error and simulate's static and dynamic figures."""
    hist = fit_hist(fit_trace, recipe_name, workdir / "fit.hist.json")
    rows = []
    for i, (precision, max_error) in enumerate(PLANS):
        plan = workdir / f"plan{i}.json"
        extra = ("--max-error", max_error) if max_error is not None else ()
        made = run("plan", hist, "--recipe", recipe_name, "--hot-gib", hot_gib, "--precision", precision,
                   *extra, "-o", plan)
        sim = run("simulate", "--trace", replay_trace, "--recipe", recipe_name, "--plan", plan,
                  "--precision", precision, "--policies", "static,dynamic", "--dyn-steps", DYN_STEPS)
        name = precision if max_error is None else f"auto <= {max_error:g}"
        rows.append({"name": name, "expected_error": made["precision"]["expected_error"],
                     "experts": made["precision"]["experts"], **{p: sim["policies"][p] for p in ("static", "dynamic")}})
    return rows


def print_table(rows: list[dict], title: str) -> None:
    native = rows[0]
    print(title)
    print("errors: MADE UP (seeded synthetic, see the docstring), not measured on the model")
    print(f"{'precision':<14} {'exp. error':>10} {'experts hot n/f/m':>18}   "
          f"{'static hit':>10} {'MiB/step':>9} {'vs native':>9}   "
          f"{'dynamic hit':>11} {'MiB/step':>9} {'vs native':>9} {'copies':>6}")
    for r in rows:
        err = "-" if r["expected_error"] is None else f"{r['expected_error']:.4f}"
        hot = "/".join(str(r["experts"].get(p, {}).get("hot", 0)) for p in ("native", "fp8", "mxfp4"))
        cells = []
        for policy in ("static", "dynamic"):
            s, base = r[policy], native[policy]["pcie_bytes_per_step"]
            ratio = base / s["pcie_bytes_per_step"] if s["pcie_bytes_per_step"] else float("inf")
            cells.append(f"{100 * s['hit_rate']:>9.2f}% {s['pcie_bytes_per_step'] / MIB:>9.0f} {ratio:>8.2f}x")
        print(f"{r['name']:<14} {err:>10} {hot:>18}   {cells[0]}   {cells[1]:>30} {r['dynamic']['copies']:>6}")


def main() -> int:
    fit, law = (DATA / f"esft-v2lite-{t}.trace.npz" for t in ("intent", "law"))
    if not (fit.is_file() and law.is_file()):
        print(f"skipped: the shared ESFT traces are not in {DATA}")
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = rows_for(fit, law, "deepseek-v2-lite", HOT_GIB, Path(tmp))
    print_table(rows, f"deepseek-v2-lite, {HOT_GIB} GiB hot: plans made on ESFT intent, replayed on law "
                      f"(32 tokens per step; dynamic: dyn_steps {DYN_STEPS})")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    np.set_printoptions(suppress=True)
    sys.exit(main())
