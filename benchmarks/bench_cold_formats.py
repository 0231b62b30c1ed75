"""The expert kernels' cold path at each stored precision: GB/s of stored bytes read in place from
the cold bank (every expert of one layer cold, one assignment each: selftest's `cold_path_gbps`),
next to the raw zero-copy read of pinned memory measured in the same run. DeepSeek-V3-sized
experts: hidden 7168, moe_intermediate 2048 (deepseek-ai/DeepSeek-V3 config.json), 32 of them.

    python benchmarks/bench_cold_formats.py [--precisions fp8,mxfp4] [--json]   # on a GPU
    python benchmarks/bench_cold_formats.py --scale 0.02                        # CPU-sized check

scripts/gpu_checks.sh runs it (step `cold_formats`); its summary prints one line per precision.
Each precision is measured on its own: an exception is that row's `error`. The report is always
printed; the exit code is 1 when a row failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotsplit_runtime.device import DeviceInfo, choose_device  # noqa: E402
from hotsplit_runtime.kernels import choose_compute  # noqa: E402
from hotsplit_runtime.moe import MoEGeometry  # noqa: E402
from hotsplit_runtime.precision import MX_GROUP, stored_format  # noqa: E402
from hotsplit_runtime.selftest import cold_path_gbps, error_line, raw_zero_copy_gbps  # noqa: E402

from hotsplit_cli.config.knobs import PRECISIONS  # noqa: E402
from hotsplit_cli.hotset.sizes import scaled_dim  # noqa: E402

RAW_BYTES = 256 << 20  # the raw zero-copy read's buffer


def geometry(scale: float) -> MoEGeometry:
    """DeepSeek-V3's routed experts (dims kept multiples of mxfp4's 32-input group when scaled)."""
    return MoEGeometry(hidden=scaled_dim(7168, scale, MX_GROUP), inter=scaled_dim(2048, scale, MX_GROUP),
                       num_experts=32, top_k=8, shared_inter=0, router="softmax")


def measure(info: DeviceInfo, precisions: list[str], scale: float, reps: int) -> dict:
    """The report: device, kernel, geometry, the raw zero-copy read (None where the device has
    none), and per precision its stored bytes, GB/s and share of the raw read, or its error."""
    g = geometry(scale)
    doc = {"device": info.name, "kernel": choose_compute(info).name, "hidden": g.hidden, "inter": g.inter,
           "experts": g.num_experts, "raw_gbps": None, "rows": []}
    if info.zero_copy:
        doc["raw_gbps"] = raw_zero_copy_gbps(info, RAW_BYTES)
    for precision in precisions:
        row = {"precision": precision}
        try:
            gbps, n_bytes = cold_path_gbps(info, g, stored_format(precision), reps)
            row.update(gbps=gbps, read_bytes=n_bytes, vs_raw=gbps / doc["raw_gbps"] if doc["raw_gbps"] else None)
        except Exception as exc:  # one precision failing never hides the others
            row["error"] = error_line(exc)
        doc["rows"].append(row)
    return doc


def report_lines(doc: dict) -> list[str]:
    raw = doc["raw_gbps"]
    lines = [f"cold path by stored precision on {doc['device']} ({doc['kernel']}; {doc['experts']} experts, hidden "
             f"{doc['hidden']}, inter {doc['inter']}, all cold): raw zero-copy read "
             + (f"{raw:.1f} GB/s" if raw else "not measured (no zero-copy on this device)")]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"  {r['precision']:6} error: {r['error']}")
            continue
        share = f" = {100 * r['vs_raw']:.0f}% of the raw read" if r["vs_raw"] is not None else ""
        lines.append(f"  {r['precision']:6} {r['gbps']:.3g} GB/s of stored bytes ({r['read_bytes'] / 1e6:.1f} MB a "
                     f"step){share}")
    return lines


def parse_precisions(text: str) -> list[str]:
    names = [p for p in text.split(",") if p]
    bad = [p for p in names if p not in PRECISIONS or p == "auto"]
    if bad or not names:
        raise ValueError(f"--precisions takes native, fp8 and mxfp4, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="fp8,mxfp4", help="comma-separated: native, fp8, mxfp4")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the experts (below 1: any device)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per precision (the median is kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        precisions = parse_precisions(args.precisions)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = choose_device("auto")
    if args.scale >= 1.0 and not info.is_cuda:
        print("error: full-size experts need a CUDA GPU (1.4 GB a layer in fp8); pass --scale 0.02 on a CPU",
              file=sys.stderr)
        return 2
    doc = measure(info, precisions, args.scale, args.reps)
    print(json.dumps(doc) if args.json else "\n".join(report_lines(doc)))
    return 1 if any("error" in r for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
