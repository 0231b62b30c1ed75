"""Hot-set policies on real routing: the ESFT DeepSeek-V2-Lite traces, fit on one task, replay another.

Data: `../shared/data/routing/esft-v2lite-{intent,law}.trace.npz` next to the repository (see that
folder's README; not in the repository). Without it the script says so and exits.
Geometry: the deepseek-v2-lite recipe (26 MoE layers x 64 experts, top-6); 416 of the 1,664
experts hot (a quarter), the budget `simulate --hot-gib` would get from 416 x expert bytes.
The static hot set is fitted on the other task's counts (what `simulate --fit HIST` does), or on
the same task's (the stationary check: there static is also the hindsight set). A line before the
table says how far apart the two fitted hot sets are, per layer (min-max over layers).

Rows: every policy of `simulate` at the seed knobs (dyn_max_swaps 2, dyn_margin 1.25) and
dyn_steps 8 and 32; the rule shipped before (the last window's counts, i-th strongest cold
against i-th weakest hot); the swap rule at other `dyn_decay` values; the default rule under a
looser cap (dyn_max_swaps 4 and 8); and rules that were tried and lost, kept here to show it:
- decayed alone: swaps on the decayed score in every layer, never on the last window: best on
  the ESFT pairs, but far behind on a hotspot that moves every few windows (the synthetic rows);
- break-even: the decayed score plus a ski-rental test in bytes: swap only when the expected
  cold reads saved over a horizon of 1 / (1 - decay) windows exceed the one copy it costs
  (activation chance per step from the decayed count, Poisson);
- lookahead: swaps the same number per layer per window but knows the rest of the trace (a
  reference for what a cap of dyn_max_swaps allows, not a policy);
- bound: `simulate.swap_cap_bound`, a proven ceiling for every rule that swaps at most
  dyn_max_swaps per layer per window (each window gets the best hot set within reach of the
  start, knowing that window's counts), and a looser one where slots may also move between layers.

First tables: the recommended dynamic mode (dyn_rule breakeven, dyn_steps 8, dyn_max_swaps 16)
on every pair the shared ESFT tasks make (another task; a task, then another; the task itself;
its second half fitted on its first), against LFU, LRU and static, with the acceptance verdict
per pair; then the same rule at half and twice the budget and at other windows (worst pair).

Run: .venv/bin/python benchmarks/bench_policies.py   (about 25 s on 2 cores)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from hotsplit_cli.analysis.simulate import (
    POLICIES,
    PolicyRun,
    SimConfig,
    _static_stats,
    run_dynamic,
    simulate,
    summarise,
    swap_cap_bound,
)
from hotsplit_cli.config.knobs import DYN_DECAY, DYN_SIGMAS
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.planner import Swap, plan_hot_set, propose_swaps
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
# The shared routing records beside the checkout (../shared), or beside a worktree's parent folder.
DATA = next((p / "shared" / "data" / "routing" for p in ROOT.parents[:2] if (p / "shared").is_dir()),
            ROOT.parent / "shared" / "data" / "routing")
TASKS = ("intent", "law")  # the pair the history tables compare; the recommended table takes every task there
REC_RULE, REC_STEPS, REC_SWAPS = "breakeven", 8, 16  # the recommended dynamic knobs (docs/simulate.md)
STATIONARY_POINTS = 0.5  # the most a dynamic rule may lose to static on stationary traffic (hit-rate points)
HOT_EXPERTS = 416  # of 26 x 64 = 1,664
MAX_SWAPS, MARGIN = 2, 1.25  # the seed defaults (knobs.py)


def windowed(counts_SLE, hot_LE, dyn_steps, decide) -> PolicyRun:
    """A window-boundary rule: `decide(end, window_counts_LE, hot_LE)` returns the swaps."""
    S = counts_SLE.shape[0]
    hot = hot_LE.copy()
    hits, cold, copied = np.zeros(S), np.zeros(S, dtype=np.int64), np.zeros(S, dtype=np.int64)
    for a in range(0, S, dyn_steps):
        b = min(S, a + dyn_steps)
        hits[a:b], cold[a:b] = _static_stats(counts_SLE[a:b], hot)
        if b >= S:
            break
        swaps = decide(b, counts_SLE[a:b].sum(axis=0), hot)
        for s in swaps:
            hot[s.layer, s.out_expert], hot[s.layer, s.in_expert] = False, True
        copied[b] = len(swaps)
    return PolicyRun("dynamic", hits, cold, copied, int(hot_LE.sum()))


def break_even(counts_SLE, hot_LE, dyn_steps, decay):
    state = {"score": None, "steps": 0.0}
    horizon = dyn_steps / (1 - decay) if decay < 1 else counts_SLE.shape[0]

    def decide(end, c_LE, hot):
        st = state
        st["score"] = c_LE if st["score"] is None else decay * st["score"] + c_LE
        st["steps"] = decay * st["steps"] + dyn_steps
        p = 1 - np.exp(-st["score"] / st["steps"])  # chance an expert is active in a step
        keep = []
        for s in propose_swaps(st["score"], hot, MAX_SWAPS, MARGIN):
            if horizon * (p[s.layer, s.in_expert] - p[s.layer, s.out_expert]) > 1.0:
                keep.append(s)
        return keep
    return windowed(counts_SLE, hot_LE, dyn_steps, decide)


def legacy(counts_SLE, hot_LE, dyn_steps):
    """The rule shipped before decayed scores: the last window's counts alone, the i-th strongest
    cold expert against the i-th weakest hot one, stopping at the first pair within the margin."""
    def decide(end, c_LE, hot):
        out = []
        ids = np.arange(c_LE.shape[1])
        for layer, c in enumerate(c_LE):
            cold, warm = ids[~hot[layer]], ids[hot[layer]]
            ins = cold[np.lexsort((cold, -c[cold]))][:MAX_SWAPS]
            outs = warm[np.lexsort((warm, c[warm]))][:MAX_SWAPS]
            for e_in, e_out in zip(ins, outs, strict=False):
                if not c[e_in] > MARGIN * c[e_out]:
                    break
                out.append(Swap(layer, int(e_out), int(e_in), float(c[e_in]), float(c[e_out])))
        return out
    return windowed(counts_SLE, hot_LE, dyn_steps, decide)


def decayed_only(counts_SLE, hot_LE, dyn_steps, decay):
    state = {"score": None}

    def decide(end, c_LE, hot):
        state["score"] = c_LE if state["score"] is None else decay * state["score"] + c_LE
        return propose_swaps(state["score"], hot, MAX_SWAPS, MARGIN)
    return windowed(counts_SLE, hot_LE, dyn_steps, decide)


def lookahead(counts_SLE, hot_LE, dyn_steps):
    return windowed(counts_SLE, hot_LE, dyn_steps,
                    lambda end, c_LE, hot: propose_swaps(counts_SLE[end:].sum(axis=0), hot, MAX_SWAPS, 1.0))


def pairs(counts: dict) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(name, drift | stationary, fit counts [L, E], replayed counts [S, L, E]) for every task
    pair: another task, a task followed by another, the task itself, its second half fitted on
    its first."""
    out = []
    for a in counts:
        for b in counts:
            if a != b:
                out.append((f"{a} -> {b}", "drift", counts[a].sum(axis=0), counts[b]))
                out.append((f"{a} -> {a} then {b}", "drift", counts[a].sum(axis=0),
                            np.concatenate([counts[a], counts[b]])))
    for a, c in counts.items():
        h = len(c) // 2
        out.append((f"{a} -> {a}", "stationary", c.sum(axis=0), c))
        out.append((f"{a} first half -> second half", "stationary", c[:h].sum(axis=0), c[h:]))
    return out


def judge(kind: str, row: dict) -> str:
    """Whether the recommended rule holds its acceptance on this pair, and by how much."""
    dyn, lfu, static = row["dynamic"], row["lfu"], row["static"]
    if kind == "drift":
        ok = dyn.hit_rate >= lfu.hit_rate and dyn.pcie_bytes_per_step <= lfu.pcie_bytes_per_step
        return (f"{'yes' if ok else 'NO'}: hit {100 * (dyn.hit_rate - lfu.hit_rate):+.2f} points, "
                f"{(dyn.pcie_bytes_per_step - lfu.pcie_bytes_per_step) / (1 << 20):+.1f} MiB/step vs lfu")
    gap = 100 * (dyn.hit_rate - static.hit_rate)
    return f"{'yes' if gap >= -STATIONARY_POINTS else 'NO'}: {gap:+.2f} points vs static"


def recommended_rows(counts: dict, size: int, hot: int, dyn_steps: int, swaps: int) -> list[tuple[str, str, dict]]:
    """Every pair replayed under the dynamic rules at the given knobs, LFU, LRU, static and hindsight."""
    rows = []
    for name, kind, fit, c in pairs(counts):
        L, E = fit.shape
        hot_LE = plan_hot_set(fit, size, hot * size).hot_RLE[0]
        a_S = c.sum(axis=(1, 2))
        cfg = SimConfig(size, hot * size, dyn_steps, dyn_steps, swaps, MARGIN, dyn_rule=REC_RULE)
        runs = simulate(c, hot_LE, cfg, ("dynamic", "lfu", "lru", "static", "hindsight"))
        runs["credit"] = run_dynamic(c, hot_LE, dyn_steps, swaps, MARGIN, rule="credit")
        rows.append((name, kind, {n: summarise(r, a_S, size, dyn_steps) for n, r in runs.items()}))
    return rows


def recommended_table(counts: dict, size: int) -> None:
    """The acceptance table: at the recommended knobs, each rule as a fraction of hindsight, with bytes."""
    print(f"recommended: dyn_rule {REC_RULE}, dyn_steps {REC_STEPS}, dyn_max_swaps {REC_SWAPS}, dyn_margin "
          f"{MARGIN}, dyn_decay {DYN_DECAY}, dyn_sigmas {DYN_SIGMAS}; {HOT_EXPERTS} hot experts; tasks "
          f"{', '.join(counts)}; each cell: hit rate of hindsight, PCIe MiB/step")
    print("| fit -> replay | traffic | dynamic (breakeven) | dynamic (credit, same knobs) | lfu | lru | static "
          "| holds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, kind, row in recommended_rows(counts, size, HOT_EXPERTS, REC_STEPS, REC_SWAPS):
        best = row["hindsight"].hit_rate
        cells = " | ".join(f"{row[n].hit_rate / best:.4f}, {row[n].pcie_bytes_per_step / (1 << 20):.1f}"
                           for n in ("dynamic", "credit", "lfu", "lru", "static"))
        print(f"| {name} | {kind} | {cells} | {judge(kind, row)} |")


def robustness(counts: dict, size: int) -> None:
    """The recommended rule at other budgets and windows: the worst pair of each kind."""
    print("| hot experts | dyn_steps | worst drift pair: hit vs lfu (points), MiB/step vs lfu | worst stationary "
          "pair: points vs static | holds on every pair |")
    print("| ---: | ---: | --- | --- | --- |")
    for hot in (HOT_EXPERTS // 2, HOT_EXPERTS, 2 * HOT_EXPERTS):
        for dyn in (4, REC_STEPS, 16):
            rows = recommended_rows(counts, size, hot, dyn, REC_SWAPS)
            drift = [r for _, k, r in rows if k == "drift"]
            stat = [r for _, k, r in rows if k != "drift"]
            hit = min(100 * (r["dynamic"].hit_rate - r["lfu"].hit_rate) for r in drift)
            mib = max((r["dynamic"].pcie_bytes_per_step - r["lfu"].pcie_bytes_per_step) / (1 << 20) for r in drift)
            gap = min(100 * (r["dynamic"].hit_rate - r["static"].hit_rate) for r in stat)
            ok = all(judge(k, r).startswith("yes") for _, k, r in rows)
            print(f"| {hot} | {dyn} | {hit:+.2f}, {mib:+.1f} | {gap:+.2f} | {'yes' if ok else 'NO'} |")


def main() -> int:
    paths = {t: DATA / f"esft-v2lite-{t}.trace.npz" for t in TASKS}
    if not all(p.exists() for p in paths.values()):
        print(f"skipped: the shared routing data is not at {DATA} (see the routing README)")
        return 0
    recipe = load_recipe("deepseek-v2-lite")
    E = recipe.model.num_experts
    size = expert_bytes_per_rank(recipe)
    every = {p.name.split("-")[-1].split(".")[0]: p for p in sorted(DATA.glob("esft-v2lite-*.trace.npz"))}
    counts = {t: load_trace(p, E).counts_SLE(E) for t, p in every.items()}
    recommended_table(counts, size)
    robustness(counts, size)
    counts = {t: counts[t] for t in TASKS}
    mib = size / (1 << 20)
    print(f"data: {DATA}; deepseek-v2-lite, {HOT_EXPERTS} hot experts of {mib:.2f} MiB; "
          f"dyn_max_swaps {MAX_SWAPS}, dyn_margin {MARGIN}; default dyn_decay {DYN_DECAY}")
    fitted_distance(counts, size)
    print("| fit -> replay | dyn_steps | policy | hit rate | of hindsight | PCIe MiB/step | experts copied |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for fit, replay in (("intent", "law"), ("law", "intent"), ("law", "law"), ("intent", "intent")):
        c = counts[replay]
        a_S = c.sum(axis=(1, 2))
        hot = plan_hot_set(counts[fit].sum(axis=0), size, HOT_EXPERTS * size).hot_RLE[0]
        for dyn in (8, 32):
            cfg = SimConfig(size, HOT_EXPERTS * size, dyn, dyn, MAX_SWAPS, MARGIN)
            runs = simulate(c, hot, cfg, POLICIES)
            runs["before: last window, i-th pairs"] = legacy(c, hot, dyn)
            for d in (0.0, 0.5, 1.0):
                runs[f"dynamic, dyn_decay {d:g}"] = run_dynamic(c, hot, dyn, MAX_SWAPS, MARGIN, decay=d)
            for cap in (4, 8):
                runs[f"dynamic, dyn_max_swaps {cap}"] = run_dynamic(c, hot, dyn, cap, MARGIN)
            runs["decayed alone (lost)"] = decayed_only(c, hot, dyn, DYN_DECAY)
            runs["break-even (lost)"] = break_even(c, hot, dyn, DYN_DECAY)
            runs["lookahead (reference)"] = lookahead(c, hot, dyn)
            best = runs["hindsight"].hits_S.sum() / a_S.sum()
            for name, run in runs.items():
                s = summarise(run, a_S, size, dyn)
                label = f"dynamic, dyn_decay {DYN_DECAY:g} (default)" if name == "dynamic" else name
                print(f"| {fit} -> {replay} | {dyn} | {label} | {100 * s.hit_rate:.2f}% | {s.hit_rate / best:.4f} "
                      f"| {s.pcie_bytes_per_step / (1 << 20):.1f} | {s.copies} |")
            for across, label in ((False, "per layer"), (True, "slots may also move between layers")):
                b = swap_cap_bound(c, hot, dyn, MAX_SWAPS, across_layers=across) / a_S.sum()
                print(f"| {fit} -> {replay} | {dyn} | bound: any rule at {MAX_SWAPS} swaps per layer per window, "
                      f"{label} | {100 * b:.2f}% | {b / best:.4f} | - | - |")
    synthetic_drift(size)
    return 0


def fitted_distance(counts: dict, size: int) -> None:
    """How far apart the two tasks' fitted hot sets are, layer by layer (min-max over layers):
    what a window-capped swap rule has to cover when it starts on the other task's fit."""
    hot = {t: plan_hot_set(counts[t].sum(axis=0), size, HOT_EXPERTS * size).hot_RLE[0] for t in TASKS}
    a, b = (hot[t] for t in TASKS)

    def span(x) -> str:
        return f"{int(x.min())}-{int(x.max())}"
    print(f"fitted hot sets, {TASKS[0]} vs {TASKS[1]}, per layer (min-max over {a.shape[0]} layers): "
          f"{span((a ^ b).sum(axis=1))} experts hot in one fit and not the other "
          f"({span((a & ~b).sum(axis=1))} {TASKS[0]} only, {span((b & ~a).sum(axis=1))} {TASKS[1]} only); "
          f"hot experts per layer {span(a.sum(axis=1))} {TASKS[0]}, {span(b.sum(axis=1))} {TASKS[1]}")


def synthetic_drift(size: int) -> None:
    """The tiny recipe's traffic (Zipf 1.1, 4 layers x 32 experts, 16 tokens x top-4 per step)
    with a hotspot that moves every `drift` steps; 21 hot experts fitted on the first window."""
    print("| synthetic drift | dyn_steps | rule | hit rate | of hindsight |")
    print("| --- | ---: | --- | ---: | ---: |")
    for drift, steps in ((40, 120), (60, 600), (150, 600)):
        tr = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), (1, 2, 3, 4), steps, 16, 4, drift_every=drift, seed=0)
        c = tr.counts_SLE(32)
        best = (c * plan_hot_set(c.sum(axis=0), size, 21 * size).hot_RLE[0]).sum()
        for dyn in (30, 50):
            hot = plan_hot_set(c[:dyn].sum(axis=0), size, 21 * size).hot_RLE[0]
            rows = ((f"dynamic, dyn_decay {DYN_DECAY:g} (default)", run_dynamic(c, hot, dyn, MAX_SWAPS, MARGIN)),
                    ("before: last window, i-th pairs", legacy(c, hot, dyn)),
                    ("decayed alone (lost)", decayed_only(c, hot, dyn, DYN_DECAY)))
            for name, run in rows:
                hits = run.hits_S.sum()
                print(f"| every {drift} of {steps} steps | {dyn} | {name} | {100 * hits / c.sum():.2f}% "
                      f"| {hits / best:.4f} |")


if __name__ == "__main__":
    sys.exit(main())
