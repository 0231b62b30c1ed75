"""Step time of the hot/cold runtime vs the all-resident reference MoE of the same geometry on the
same device, batch 1 / 8 / 64 x hot fraction 100% / 50% / 10%; ratios side by side, measured
interleaved in one process so machine noise hits both alike. Each row is measured on its own: an
exception in one row is that row's `error`, the others still run, and the report is always
printed (exit 1 when a row failed).

    .venv/bin/python benchmarks/bench_runtime.py                    # tiny recipe, auto device
    .venv/bin/python benchmarks/bench_runtime.py --recipe deepseek-v3 --scale 0.05 --json

`--full-size`: real expert sizes (DeepSeek-V2-Lite bf16, DeepSeek-V3 fp8), batch 1 / 8 / 32 / 128
x hot 100% / 25% / 0%, side by side with torch._grouped_mm over the same all-resident layer
(benchmarks/fullsize.py). Needs a CUDA GPU; `--scale 0.02` runs the same table CPU-sized.

    python benchmarks/bench_runtime.py --full-size [--platform platform.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hotsplit_runtime.device import DeviceInfo, choose_device, tune_cpu_threads  # noqa: E402
from hotsplit_runtime.fp8 import RELEASE_FP8  # noqa: E402
from hotsplit_runtime.moe import MoEGeometry  # noqa: E402
from hotsplit_runtime.selftest import error_line, step_time_ratio  # noqa: E402
from reporting import load_average, load_span  # noqa: E402

from hotsplit_cli.config.recipe import load_recipe  # noqa: E402
from hotsplit_cli.core.errors import HotsplitError  # noqa: E402


def refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def platform_zero_copy(path: str, info: DeviceInfo) -> tuple[float | None, str]:
    """The probe's zero-copy read of this GPU from platform.json (None when it has none)."""
    from hotsplit_cli.config.platform_file import load_platform

    plat = load_platform(path)
    index = info.device.index or 0
    gpu = plat.gpu_of_cuda(index)
    if gpu is None or gpu.zero_copy_read_gbps is None:
        return None, f"{path} has no zero-copy read for cuda:{index}"
    return gpu.zero_copy_read_gbps, f"hotsplit probe ({path})"


def full_size(args, info: DeviceInfo) -> int:
    import fullsize

    scale = 1.0 if args.scale is None else args.scale
    if not info.is_cuda and scale >= 1.0:
        refuse("--full-size needs a CUDA GPU (DeepSeek-V3's experts are 11 GB a layer, torch._grouped_mm in "
               "bf16 needs sm90); on a CPU add --scale 0.02 to run the same table CPU-sized")
    zc, source = (None, "")
    if args.platform:
        try:
            zc, source = platform_zero_copy(args.platform, info)
        except HotsplitError as exc:
            refuse(exc.message)
    doc = fullsize.full_size_doc(info, fullsize.FULL_SIZE_MODELS, fullsize.BATCHES, fullsize.HOT_FRACTIONS, scale,
                                 zc, source if zc else "", args.budget_ms)
    if zc is None and args.platform:
        doc["reasons"]["platform"] = source
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(fullsize.table_lines(doc)))
    return 1 if doc["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--scale", type=float, default=None, help="default: the recipe's run.scale (--full-size: 1)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--layers", type=int, default=None, help="MoE layers to stack (default: min(4, recipe's))")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--full-size", action="store_true", help="real expert sizes, side by side with grouped_mm")
    ap.add_argument("--platform", default=None, help="--full-size: platform.json whose zero-copy read to compare "
                    "with (default: measured in this process)")
    ap.add_argument("--budget-ms", type=float, default=300.0, help="--full-size: timing budget of each figure")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    try:
        info = choose_device(args.device)
    except HotsplitError as exc:
        refuse(exc.message)
    tune_cpu_threads(info)
    if args.full_size:
        return full_size(args, info)
    recipe = load_recipe(args.recipe)
    geom = MoEGeometry.from_recipe(recipe, recipe.run.scale if args.scale is None else args.scale)
    layers = args.layers or min(4, recipe.model.num_moe_layers)
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    name = str(dtype).replace("torch.", "")
    # fp8 recipes keep their experts fp8 where the kernels run, as `hotsplit run` does.
    fp8 = RELEASE_FP8 if recipe.model.expert_dtype == "fp8" and info.triton else None
    rows = []
    load = load_average()
    for batch in (1, 8, 64):
        for hot in (1.0, 0.5, 0.1):
            try:
                rows.append(step_time_ratio(info, dtype, batch, hot, reps=args.reps, geom=geom, num_layers=layers,
                                            fp8=fp8))
            except Exception as exc:  # a CUDA error included: this row's error, the others still run
                rows.append({"batch": batch, "hot_fraction": hot, "error": error_line(exc)})
    doc = {"load_average": [load, load_average()],
           "recipe": recipe.name, "device": info.name, "kernel": "triton" if info.triton else "torch-grouped",
           "geometry": geom.__dict__, "layers": layers, "dtype": str(dtype),
           "experts": fp8.describe() if fp8 else name, "rows": rows}
    failed = sum("error" in r for r in rows)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 1 if failed else 0
    print(f"{recipe.name} on {info.name} ({doc['kernel']}, experts {doc['experts']}), {layers} MoE layers, "
          f"hidden {geom.hidden}, "
          f"inter {geom.inter}, {geom.num_experts} experts, top-{geom.top_k}; median of {args.reps} interleaved pairs, "
          f"ratio spread p10-p90 over the pairs; {load_span(load)}")
    print("| batch | hot | runtime ms | reference ms | runtime / reference (p10-p90) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['batch']} | {100 * r['hot_fraction']:.0f}% | error: {r['error']} | | |")
            continue
        print(f"| {r['batch']} | {100 * r['hot_fraction']:.0f}% | {r['runtime_ms']:.3f} | {r['reference_ms']:.3f} "
              f"| {r['ratio']:.3f} ({r['ratio_p10']:.2f}-{r['ratio_p90']:.2f}) |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
