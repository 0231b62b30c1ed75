"""Time, not tokens: the token-balanced layout (`place`) and the time-balanced one
(`place --platform`) side by side, each rank's predicted time per decode step by the plan's cost
model (hotsplit_cli/hotset/ranktime.py), on the SGLang DeepSeek-R1 pairs.

Deployment: recipes/deepseek-v3-ep8.yaml (tp 1, ep 8: 8 ranks of one node), 32 redundant experts,
a hot budget of 20 GiB per rank (--hot-gib 20), batch = the recipe's traffic.batch (32 tokens per
step). Fitted on the first file of each pair (data README), timed on it and on the second (--eval).

Read rate: a platform.json written here whose only figure is a GPU zero-copy read of
`--read-gbps` GB/s (default 50, an assumed round figure, not a measurement: pass a real
platform.json with --platform). Every predicted time is cold bytes / that rate, so the ratio of the
two layouts does not depend on it.

Traffic: `../shared/data/routing` next to the repository (see that folder's README; not in the
repository). Without it the script says so and uses heavy-tailed synthetic counts.

Run: .venv/bin/python benchmarks/bench_place_time.py [--platform platform.json | --read-gbps 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_place import load_pairs  # noqa: E402

from hotsplit_cli.config.knobs import resolve_knobs  # noqa: E402
from hotsplit_cli.config.recipe import load_recipe  # noqa: E402
from hotsplit_cli.hotset.placetime import place_by_time  # noqa: E402
from hotsplit_cli.placement.report import PlaceRequest, place_from_hist  # noqa: E402
from hotsplit_cli.traffic.hist import Histogram, save_hist  # noqa: E402

RECIPE, RANKS, REDUNDANT, HOT_GIB = "deepseek-v3-ep8", 8, 32, "20"


def write_platform(path: Path, read_gbps: float) -> Path:
    path.write_text(json.dumps({
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
        "host": {"numa_nodes": [{}], "copy_gbps": None},
        "gpus": [{"index": 0, "summary": {"zero_copy_read_gbps": read_gbps}}]}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--platform", type=Path, default=None)
    ap.add_argument("--read-gbps", type=float, default=50.0)
    args = ap.parse_args()
    source, pairs = load_pairs()
    recipe = load_recipe(RECIPE)
    knobs = resolve_knobs(recipe.knobs, {}, {"hot_gib": HOT_GIB})
    with tempfile.TemporaryDirectory() as tmp:
        platform = args.platform or write_platform(Path(tmp) / "platform.json", args.read_gbps)
        print(f"traffic: {source}; recipe {RECIPE}, {RANKS} ranks, {REDUNDANT} redundant, --hot-gib {HOT_GIB}, "
              f"platform {'(assumed) ' if args.platform is None else ''}{platform}")
        print("| pair | layout | fitted max-rank ms/step | later max-rank ms/step | later vs tokens "
              "| later balancedness | wall s (place; place --platform) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        gains = []
        for name, fit, later in pairs:
            paths = []
            for tag, counts in (("fit", fit), ("later", later)):
                hist = Histogram("deepseek-ai/DeepSeek-V3", "benchmarks/bench_place_time.py", 8,
                                 int(counts.sum() // 8), tuple(range(3, 61)), counts)
                paths.append(save_hist(Path(tmp) / f"{tag}.json", hist))
            req = PlaceRequest(paths[0], RANKS, REDUNDANT, eval_path=paths[1], platform_path=platform)
            t = time.perf_counter()
            place_from_hist(replace(req, platform_path=None), recipe)
            wall = {"tokens": time.perf_counter() - t}
            t = time.perf_counter()
            report = place_by_time(req, recipe, knobs)
            wall["time"] = time.perf_counter() - t
            rows = report.times["layouts"]
            base = rows["tokens"]["eval"]["step_ms"]
            for lay, key in (("tokens", "hotsplit"), ("time", "hotsplit-time")):
                r = rows[lay]
                print(f"| {name} | {lay}-balanced | {r['fitted']['step_ms']:.2f} | {r['eval']['step_ms']:.2f} "
                      f"| {r['eval']['step_ms'] / base:.4f} | {report.compare[key]['eval']['balancedness']:.4f} "
                      f"| {wall[lay]:.2f} |")
            gains.append(rows["time"]["eval"]["step_ms"] / base)
        print(f"later-window time of the time-balanced layout / the token-balanced one: "
              f"{' '.join(f'{g:.4f}' for g in gains)} (mean {sum(gains) / len(gains):.4f})")


if __name__ == "__main__":
    main()
