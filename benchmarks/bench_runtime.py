"""Step time of the hot/cold runtime vs the all-resident reference MoE of the same geometry on the
same device, batch 1 / 8 / 64 x hot fraction 100% / 50% / 10%; ratios side by side, measured
interleaved in one process so machine noise hits both alike.

    .venv/bin/python benchmarks/bench_runtime.py                    # tiny recipe, auto device
    .venv/bin/python benchmarks/bench_runtime.py --recipe deepseek-v3 --scale 0.05 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotsplit_cli.recipe import load_recipe  # noqa: E402
from runtime.device import choose_device, tune_cpu_threads  # noqa: E402
from runtime.fp8 import Fp8Format  # noqa: E402
from runtime.from_recipe import FP8_BLOCK  # noqa: E402
from runtime.moe import MoEGeometry  # noqa: E402
from runtime.selftest import step_time_ratio  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--scale", type=float, default=None, help="default: the recipe's run.scale")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--layers", type=int, default=None, help="MoE layers to stack (default: min(4, recipe's))")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    recipe = load_recipe(args.recipe)
    info = choose_device(args.device)
    tune_cpu_threads(info)
    geom = MoEGeometry.from_recipe(recipe, recipe.run.scale if args.scale is None else args.scale)
    layers = args.layers or min(4, recipe.model.num_moe_layers)
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    name = str(dtype).replace("torch.", "")
    # fp8 recipes keep their experts fp8 where the kernels run, as `hotsplit run` does.
    fp8 = Fp8Format(FP8_BLOCK) if recipe.model.expert_dtype == "fp8" and info.triton else None
    rows = [step_time_ratio(info, dtype, batch, hot, reps=args.reps, geom=geom, num_layers=layers, fp8=fp8)
            for batch in (1, 8, 64) for hot in (1.0, 0.5, 0.1)]
    doc = {"recipe": recipe.name, "device": info.name, "kernel": "triton" if info.triton else "torch-grouped",
           "geometry": geom.__dict__, "layers": layers, "dtype": str(dtype),
           "experts": "fp8 e4m3, 128x128 block scales" if fp8 else name, "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{recipe.name} on {info.name} ({doc['kernel']}, experts {doc['experts']}), {layers} MoE layers, "
          f"hidden {geom.hidden}, "
          f"inter {geom.inter}, {geom.num_experts} experts, top-{geom.top_k}; median of {args.reps}")
    print("| batch | hot | runtime ms | reference ms | runtime / reference |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['batch']} | {100 * r['hot_fraction']:.0f}% | {r['runtime_ms']:.3f} | {r['reference_ms']:.3f} "
              f"| {r['ratio']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
