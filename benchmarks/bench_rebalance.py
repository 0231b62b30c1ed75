"""Live rebalancing judged on unseen counts: the balancedness a trace achieves with no
rebalancing, with the earlier rule (refit on every interval's counts whenever the live balance is
under 0.95) and with hotsplit's rule (`hotsplit_cli.placement.rebalance_rule`), replayed exactly as
the runtime serves it (`replay_rebalancing`; tests/cli/test_run_ep_rebalance.py checks a run
against it).

Drift: the ESFT DeepSeek-V2-Lite traces (`../shared/data/routing/esft-v2lite-*.trace.npz`, see
that README; skipped when absent), the start placed on one task and the other task served, at
ep 4. Stationary: synthetic Zipf traffic, the start placed on 24 steps of the same traffic.

    .venv/bin/python benchmarks/bench_rebalance.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hotsplit_cli.placement import rebalance_rule  # noqa: E402
from hotsplit_cli.placement.algorithm import Geometry, place_experts  # noqa: E402
from hotsplit_cli.placement.dispatch import contiguous_placement  # noqa: E402
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares  # noqa: E402
from hotsplit_cli.traffic.trace import load_trace  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "routing"


def counts_LE(ids_SLTK: np.ndarray, num_experts: int) -> np.ndarray:
    return np.stack([np.bincount(ids_SLTK[:, li].reshape(-1), minlength=num_experts)
                     for li in range(ids_SLTK.shape[1])]).astype(float)


def refit_always(fit_LE, judge_LE, current, live):
    """The earlier rule: a map fitted on the interval's counts, applied whenever live < 0.95."""
    recent = fit_LE + judge_LE
    if live >= rebalance_rule.EPLB_SKIP_ABOVE or not recent.any():
        return rebalance_rule.RebalanceDecision(None, "kept", 0.0, None)
    geo = Geometry(current.num_ranks, current.num_physical - recent.shape[1])
    return rebalance_rule.RebalanceDecision(place_experts(recent[None], current.layers, geo), None, 0.0, None)


def row(ids, start, num_experts: int, eplb: int) -> tuple[float, float, float]:
    rule = rebalance_rule.decide_rebalance
    none = rebalance_rule.replay_rebalancing(ids, start, num_experts, 0).balancedness
    try:
        rebalance_rule.decide_rebalance = refit_always
        old = rebalance_rule.replay_rebalancing(ids, start, num_experts, eplb).balancedness
    finally:
        rebalance_rule.decide_rebalance = rule
    new = rebalance_rule.replay_rebalancing(ids, start, num_experts, eplb).balancedness
    return none, old, new


def main() -> None:
    print("| traffic | start | eplb_steps | none | refit always | hotsplit |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    layers = (1, 2, 3, 4)
    for seed in range(4):
        shares = zipf_shares(4, 32, 1.1, seed)
        fit = synthetic_trace(shares, layers, 24, 64, 4, seed=100 + seed).topk_ids_SLTK
        run = synthetic_trace(shares, layers, 96, 64, 4, seed=200 + seed).topk_ids_SLTK
        start = place_experts(counts_LE(fit, 32)[None], layers, Geometry(4, 4))
        for eplb in (1, 8):
            print(f"| stationary Zipf seed {seed} | placed | {eplb} | " + " | ".join(f"{x:.4f}" for x in
                                                                                     row(run, start, 32, eplb)) + " |")
    if not DATA.is_dir():
        print(f"skipped the ESFT rows: the shared routing data is not at {DATA} (see the routing README)")
        return
    for fit_task, run_task in (("intent", "law"), ("law", "intent")):
        ft, rt = (load_trace(DATA / f"esft-v2lite-{t}.trace.npz", 64) for t in (fit_task, run_task))
        ids = rt.topk_ids_SLTK.astype(np.int64)
        for name, start in (("placed on " + fit_task, place_experts(counts_LE(ft.topk_ids_SLTK.astype(np.int64), 64)
                                                                   [None], tuple(ft.layers), Geometry(4, 0))),
                            ("contiguous", contiguous_placement(tuple(ft.layers), 64, 4))):
            print(f"| ESFT {run_task} | {name} | 32 | " + " | ".join(f"{x:.4f}" for x in row(ids, start, 64, 32))
                  + " |")


if __name__ == "__main__":
    main()
