"""Place time and quality on DeepSeek-V3 geometry: hotsplit vs a port of the EPLB reference.

Geometry (deepseek-ai/DeepSeek-V3 config.json): 61 layers, first_k_dense_replace 3 -> 58 MoE
layers, n_routed_experts 256, n_group 8; deployment as in DeepSeek's inference-system overview:
32 ranks (EP32), 32 redundant experts -> 288 physical experts, 9 per rank.

Traffic: the SGLang DeepSeek-R1 decode distribution when present at ROUTING (real, not in the
repo), else heavy-tailed synthetic counts. Later windows are resampled from it with
multiplicative drift (synthetic), since the real file holds one window only.

Run: .venv/bin/python benchmarks/bench_place.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eplb_port  # noqa: E402

from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts  # noqa: E402
from hotsplit_cli.placement.evaluate import choose_fit, duplicate_count, eplb_layout, evaluate  # noqa: E402

ROUTING = Path("/work/shared/fixtures/routing/sglang-deepseek-r1-decode.json")
L, E, RANKS, REDUNDANT, GROUPS, NODES = 58, 256, 32, 32, 8, 4


def best_of(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    rng = np.random.default_rng(0)
    if ROUTING.exists():
        counts = np.array(json.loads(ROUTING.read_text())["logical_count"], dtype=float)[3:]
        source = f"real: {ROUTING.name}"
    else:
        counts = rng.gamma(0.5, size=(L, E)) * 1e5
        source = "synthetic gamma(0.5)"

    def drifted(k):
        p = counts * rng.gamma(k, size=counts.shape)
        rows = [rng.multinomial(int(c.sum()), q / q.sum()) for c, q in zip(counts, p, strict=True)]
        return np.stack(rows).astype(float)

    fit_W = np.stack([drifted(64) for _ in range(4)])  # four windows around the real distribution
    later = np.stack([drifted(64) for _ in range(4)])
    print(f"traffic: {source}; {L} layers x {E} experts, {RANKS} ranks, {REDUNDANT} redundant")
    rows = []
    for nodes, groups in ((1, 1), (NODES, GROUPS)):
        geo = Geometry(RANKS, REDUNDANT, nodes, groups)
        t_ref, (phy_ref, _) = best_of(lambda g=groups, n=nodes: eplb_port.rebalance_experts(
            counts, E + REDUNDANT, g, n, RANKS, packing=eplb_port.balanced_packing_tensor), repeat=1)
        t_np, (phy_np, _) = best_of(lambda g=groups, n=nodes: eplb_port.rebalance_experts(
            counts, E + REDUNDANT, g, n, RANKS))
        t_tot, lay_tot = best_of(lambda geo=geo: eplb_layout(counts, range(L), geo))
        t_hs1, lay_hs1 = best_of(lambda geo=geo: place_experts(counts[None], range(L), geo))
        t_hsw, lay_hsw = best_of(lambda geo=geo: place_experts(fit_W, range(L), geo))

        def auto(geo=geo):  # what `hotsplit place` does by default: the held-out choice, then the fit
            choice = choose_fit(fit_W, range(L), geo)
            return choice, place_experts(fit_W if choice.mode == "windows" else fit_W.sum(0, keepdims=True),
                                         range(L), geo)
        t_auto, (choice, lay_auto) = best_of(auto, repeat=1)
        print(f"{'hier' if nodes > 1 else 'flat'} auto: {choice.reason}")
        t_hsws, lay_hsws = best_of(lambda geo=geo: place_experts(fit_W.sum(0, keepdims=True), range(L), geo))
        ref = Placement(tuple(range(L)), RANKS, phy_ref)
        for name, t, lay, fit in (
            ("EPLB port, tensor loops (reference)", t_ref, ref, counts[None]),
            ("EPLB port, numpy + lists", t_np, Placement(tuple(range(L)), RANKS, phy_np), counts[None]),
            ("hotsplit totals-only (EPLB-style)", t_tot, lay_tot, counts[None]),
            ("hotsplit, totals", t_hs1, lay_hs1, counts[None]),
            ("hotsplit, 4 windows", t_hsw, lay_hsw, fit_W),
            ("hotsplit, totals of the 4 windows", t_hsws, lay_hsws, fit_W.sum(0, keepdims=True)),
            (f"hotsplit, auto (chose {choice.mode})", t_auto, lay_auto,
             fit_W if choice.mode == "windows" else fit_W.sum(0, keepdims=True)),
        ):
            rows.append((f"{'hier' if nodes > 1 else 'flat'}", name, t * 1e3, t_ref / t,
                         evaluate(fit, lay).balancedness, evaluate(later, lay).balancedness, duplicate_count(lay)))
    print("| mode | layout | place ms | speed-up vs reference | balancedness fitted | balancedness later "
          "| dup (layer, rank) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f}x | {r[4]:.4f} | {r[5]:.4f} | {r[6]} |")


if __name__ == "__main__":
    main()
