"""The joint plan of hot set and stored precision: hit rate and PCIe MiB per step by hot budget and
precision, for deepseek-v2-lite and qwen3-30b-a3b, replayed on traffic the plan was not fitted on.

Traffic:
- deepseek-v2-lite: the shared ESFT traces (`../shared/data/routing/esft-v2lite-{intent,law}`,
  see that folder's README): fitted on intent, replayed on law, 32 tokens per step. Without the
  data, the same synthetic traffic as qwen3-30b-a3b's.
- qwen3-30b-a3b: no public routing record is shipped. Synthetic Zipf(1.1) traffic of its real
  shape (48 MoE layers x 128 experts, top-8), 32 tokens per step. The fit and the replay are two
  samples of the same shares, so its figures show bytes, not drift.

Errors: no measured errors of either model ship with hotsplit. `auto` plans with per-expert
errors of the size fp8 / mxfp4 rounding gives (about 2% and 12%, varying 0.5-1.5x by expert:
tests/planning/quality_fixture.py). Its rows therefore show how the planner spends an error
budget. They do not show either model's quality. native / fp8 / mxfp4 are the uniform plans
(`plan --precision P`).

Each row is the plan made on the fit counts at that budget. Replayed, a routed assignment to a
hot expert is a hit, and each distinct cold expert a step touches costs its stored bytes once,
as `simulate --policies static` counts them (the uniform rows equal simulate's figures). The
`predicted` column is the plan's own forecast at the replay's tokens per step.

Run: .venv/bin/python benchmarks/bench_precision_plan.py   (about 20 s on 2 cores)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' quality fixture: the one generator of synthetic errors

from hotsplit_cli.config.recipe import GIB, load_recipe  # noqa: E402
from hotsplit_cli.hotset.planfile import plan_counts_for_recipe  # noqa: E402
from hotsplit_cli.hotset.precision_plan import (  # noqa: E402
    auto_plan,
    pcie_bytes_per_step,
    routed_probs,
    uniform_choice,
)
from hotsplit_cli.hotset.quality import quality_from_doc  # noqa: E402
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares  # noqa: E402
from hotsplit_cli.traffic.trace import load_trace  # noqa: E402
from tests.planning.quality_fixture import quality_block  # noqa: E402

DATA = next((p / "shared" / "data" / "routing" for p in ROOT.parents[:2] if (p / "shared").is_dir()),
            ROOT.parent / "shared" / "data" / "routing")
MIB = 1 << 20
TOKENS_PER_STEP = 32
BUDGETS_GIB = {"deepseek-v2-lite": (2, 4, 8), "qwen3-30b-a3b": (4, 8, 16)}
MAX_ERRORS = (0.02, 0.05)  # auto's error budgets (expected relative output error)


def traffic(recipe_name: str, steps: int = 256) -> tuple[np.ndarray, np.ndarray, str]:
    """(fit counts [S, L, E], replay counts [S, L, E], where they came from)."""
    m = load_recipe(recipe_name).model
    if recipe_name == "deepseek-v2-lite" and (DATA / "esft-v2lite-law.trace.npz").is_file():
        fit, run = (load_trace(DATA / f"esft-v2lite-{t}.trace.npz", m.num_experts).counts_SLE(m.num_experts)
                    for t in ("intent", "law"))
        return fit, run, "ESFT intent fitted, law replayed"
    shares = zipf_shares(m.num_moe_layers, m.num_experts, 1.1, seed=0)
    fit, run = (synthetic_trace(shares, m.moe_layer_ids, steps, TOKENS_PER_STEP, m.top_k, seed=s)
                .counts_SLE(m.num_experts) for s in (1, 2))
    return fit, run, "synthetic Zipf(1.1), two samples"


def replay(counts_SLE: np.ndarray, hot_LE: np.ndarray, sizes_LE: np.ndarray) -> tuple[float, float]:
    """(hit rate, mean PCIe bytes per step): each distinct cold expert a step touches, at its bytes."""
    hit = float((counts_SLE * hot_LE).sum() / counts_SLE.sum())
    touched = (counts_SLE > 0) & ~hot_LE
    return hit, float((touched * sizes_LE).sum(axis=(1, 2)).mean())


def rows_for(recipe_name: str) -> tuple[list[tuple], str]:
    """One row per (budget, precision): name, hit, replayed and predicted MiB/step, expected error."""
    recipe = load_recipe(recipe_name)
    fit_SLE, run_SLE, source = traffic(recipe_name)
    fit = fit_SLE.sum(axis=0)
    quality = quality_from_doc(quality_block(fit, seed=0), fit.shape, "synthetic errors")
    pi = routed_probs(fit, recipe.model.top_k)
    rows = []
    for gib in BUDGETS_GIB[recipe_name]:
        budget = int(gib * GIB)
        plans = []
        for p in ("native", "fp8", "mxfp4"):
            choice = uniform_choice(fit, recipe, p, quality, None)
            plans.append((p, plan_counts_for_recipe(fit, recipe, budget, p).hot_RLE[0], choice))
        for max_error in MAX_ERRORS:
            plan, choice = auto_plan(fit, recipe.model.top_k, recipe, budget, quality, max_error)
            plans.append((f"auto <= {max_error:g}", plan.hot_RLE[0], choice))
        for name, hot, choice in plans:
            hit, nbytes = replay(run_SLE, hot, choice.sizes_LE)
            predicted = pcie_bytes_per_step(pi, hot, choice.sizes_LE, TOKENS_PER_STEP)
            rows.append((gib, name, hit, nbytes / MIB, predicted / MIB, choice.expected_error))
    return rows, source


def print_table(recipe_name: str, rows: list[tuple], source: str) -> None:
    print(f"\n{recipe_name} ({source}, {TOKENS_PER_STEP} tokens per step; auto's errors synthetic)")
    print(f"{'hot GiB':>7}  {'precision':<12} {'hit':>7} {'PCIe MiB/step':>14} {'predicted':>10} {'exp. error':>10}")
    for gib, name, hit, mib, predicted, err in rows:
        print(f"{gib:>7}  {name:<12} {100 * hit:>6.1f}% {mib:>14.0f} {predicted:>10.0f} {err:>10.4f}")


def main() -> None:
    start = time.perf_counter()
    for name in BUDGETS_GIB:
        rows, source = rows_for(name)
        print_table(name, rows, source)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
