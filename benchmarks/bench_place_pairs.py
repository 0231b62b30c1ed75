"""Later-window balancedness of `place` against EPLB on every ordered pair of the SGLang files.

The acceptance pairs (three, named in the routing README) give six pair-modes (flat and
hierarchical), too few to tell two layouts apart at the 0.005 level. This script fits on each
of the five SGLang DeepSeek-R1 files and judges on each of the other four (20 ordered pairs,
40 pair-modes): the mean gap to EPLB, its spread across pair-modes, and how many pair-modes fall
below EPLB - 0.005 even when the mean gap is zero.

Geometry as bench_place.py: DeepSeek-V3 (58 MoE layers x 256 experts, n_group 8), 32 ranks,
32 redundant, flat and 4 nodes. Data: `../shared/data/routing` next to the repository (not in
the repository); without it the script says so and exits.

Run: .venv/bin/python benchmarks/bench_place_pairs.py   (a few seconds: it uses the numpy port)
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eplb_port  # noqa: E402
from bench_place import GROUPS, NODES, RANKS, REDUNDANT, ROUTING, E, L, load_counts  # noqa: E402

from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts  # noqa: E402
from hotsplit_cli.placement.evaluate import evaluate  # noqa: E402

MODES = (("flat", 1, 1), ("hier", NODES, GROUPS))


def main() -> int:
    files = sorted(ROUTING.glob("sglang-r1-*.json"))
    if len(files) < 2:
        print(f"skipped: no SGLang distributions at {ROUTING} (see the routing README)")
        return 0
    counts = {f.stem.removeprefix("sglang-r1-"): load_counts(f) for f in files}
    print(f"data: {ROUTING}; {len(counts)} files, {len(counts) * (len(counts) - 1)} ordered pairs x 2 modes")
    gaps = {m: [] for m, _, _ in MODES}
    eplb_means = {m: [] for m, _, _ in MODES}
    for fit, later in itertools.permutations(counts.values(), 2):
        for mode, nodes, groups in MODES:
            geo = Geometry(RANKS, REDUNDANT, nodes, groups)
            ref = Placement(tuple(range(L)), RANKS,
                            eplb_port.rebalance_experts(fit, E + REDUNDANT, groups, nodes, RANKS)[0])
            ours = place_experts(fit[None], range(L), geo)
            e, p = evaluate(later[None], ref).balancedness, evaluate(later[None], ours).balancedness
            gaps[mode].append(p - e)
            eplb_means[mode].append(e)
    print("| mode | pair-modes | EPLB later balancedness (mean) | place - EPLB: mean | sd | min | max "
          "| below EPLB - 0.005 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    every = []
    for mode, _, _ in MODES:
        g = np.array(gaps[mode])
        every.extend(g)
        print(f"| {mode} | {len(g)} | {np.mean(eplb_means[mode]):.4f} | {g.mean():+.4f} | {g.std():.4f} "
              f"| {g.min():+.4f} | {g.max():+.4f} | {(g < -0.005).sum()} |")
    g = np.array(every)
    print(f"| both | {len(g)} | {np.mean(sum(eplb_means.values(), [])):.4f} | {g.mean():+.4f} | {g.std():.4f} "
          f"| {g.min():+.4f} | {g.max():+.4f} | {(g < -0.005).sum()} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
