"""The three cold paths side by side in one process: step time of `gpu` (zero-copy), `cpu` and
`split` with every expert cold, DeepSeek-V2-Lite full-size experts, batch 1 / 8 / 32, next to the
cost model's prediction from the rates measured in the same run.

    python benchmarks/bench_cold_path.py [--platform platform.json] [--json]   # on a GPU
    python benchmarks/bench_cold_path.py --scale 0.1                            # CPU-sized check

Targets (a GPU run): `split` within 15% of cold bytes / (zero-copy rate + CPU rate), and faster
than `gpu` whenever the CPU rate is at least 20% of the link rate. Each row is measured on its own;
an exception is that row's `error`; the report is always printed (exit 1 when a row failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fullsize import FULL_SIZE_MODELS, filled_layer, per_call_ms, routing, scaled_model  # noqa: E402
from hotsplit_runtime.cold_split import ColdSplit, SplitExperts, make_split  # noqa: E402
from hotsplit_runtime.device import choose_device, tune_cpu_threads  # noqa: E402
from hotsplit_runtime.kernels import choose_compute  # noqa: E402
from hotsplit_runtime.model import HotColdMoE  # noqa: E402
from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for  # noqa: E402
from hotsplit_runtime.selftest import error_line  # noqa: E402
from reporting import load_average, load_span  # noqa: E402

from hotsplit_cli.config.platform_file import load_platform  # noqa: E402
from hotsplit_cli.hotset.coldpath import ColdRates, split_cold  # noqa: E402

BATCHES = (1, 8, 32)
MODES = ("gpu", "cpu", "split")


def build(scale: float, info):
    """DeepSeek-V2-Lite's experts (benchmarks/fullsize.py, config.json cited there), every one cold."""
    spec = scaled_model(FULL_SIZE_MODELS[0], scale)
    g = dataclasses.replace(spec.geom, shared_inter=0)
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    layers = [filled_layer(g, dtype, None) for _ in range(spec.layers)]
    alloc = PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
    model = HotColdMoE(layers, g, np.zeros((spec.layers, g.num_experts), dtype=bool), info, alloc,
                       choose_compute(info))
    return spec, g, model


def predicted_ms(ids_LTK: torch.Tensor, bank, rates: ColdRates, mode: str) -> float:
    """The cost model's cold time of one step: per layer, its distinct experts and token counts."""
    total = 0.0
    for ids in ids_LTK.cpu().numpy():
        experts, tokens = np.unique(ids, return_counts=True)
        total += split_cold(np.full(len(experts), float(bank.expert_bytes)), tokens, rates, mode).seconds
    return total * 1e3


def rows(model, g, spec, info, rates: ColdRates, rounds: int) -> list[dict]:
    """Each batch's three modes, `rounds` times, the modes taking turns at going first (a load
    change hits every mode alike); per mode the median step and achieved / predicted with its
    spread (min-max over rounds)."""
    bank = model.banks[0]
    device_compute = model.compute
    splits = {m: ColdSplit(m, rates, info) for m in ("cpu", "split")}
    out = []
    for batch in BATCHES:
        ids, w = routing(g, spec.layers, batch, info.device)
        x = torch.randn(batch, g.hidden, generator=torch.Generator().manual_seed(batch)).to(info.device,
                                                                                           bank.compute_dtype)
        distinct = sum(len(np.unique(i)) for i in ids.cpu().numpy())
        cold_bytes = distinct * bank.expert_bytes
        row = {"batch": batch, "cold_experts": distinct, "cold_bytes": cold_bytes}
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                if f"{mode}_error" in row:
                    continue
                try:
                    model.compute = device_compute if mode == "gpu" else SplitExperts(device_compute, splits[mode])
                    times[mode].append(per_call_ms(lambda ids=ids, w=w, x=x: model.step(x, ids, w), info))
                except Exception as exc:  # noqa: BLE001 - one row's failure is that row's error
                    row[f"{mode}_error"] = error_line(exc)
                finally:
                    model.compute = device_compute
        for mode in MODES:
            if f"{mode}_error" in row:
                continue
            pred = row[f"{mode}_predicted_ms"] = predicted_ms(ids, bank, rates, mode)
            row[f"{mode}_ms"] = statistics.median(times[mode])
            row[f"{mode}_ms_rounds"] = times[mode]
            row[f"{mode}_vs_predicted"] = [statistics.median(times[mode]) / pred, min(times[mode]) / pred,
                                           max(times[mode]) / pred]
        ideal_gbps = (rates.zero_copy_gbps or 0) + rates.cpu_gbps(batch * g.top_k / g.num_experts)
        row["ideal_split_ms"] = cold_bytes / (ideal_gbps * 1e9) * 1e3 if ideal_gbps else None
        if row.get("split_ms") and row["ideal_split_ms"]:
            row["split_vs_ideal"] = row["split_ms"] / row["ideal_split_ms"]
        if row.get("split_ms") and row.get("gpu_ms"):
            row["split_vs_gpu"] = row["split_ms"] / row["gpu_ms"]
        out.append(row)
    for s in splits.values():
        s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", help="platform.json from `hotsplit probe` (else the rates are measured now)")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink hidden sizes (a CPU-sized check)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per batch (default 5)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2
    info = choose_device("auto")
    if args.scale >= 1.0 and not info.is_cuda:
        print("error: full-size experts need a CUDA GPU; pass --scale 0.1 for a CPU-sized check", file=sys.stderr)
        return 2
    tune_cpu_threads(info)
    spec, g, model = build(args.scale, info)
    platform = load_platform(args.platform) if args.platform else None
    split = make_split("split", info, model.banks[0], platform)
    load = load_average()
    doc = {"model": spec.name, "rounds": args.rounds, "scale": args.scale, "device": info.name,
           "kernel": model.compute.name,
           "rates": split.rates_source, "expert_bytes": model.banks[0].expert_bytes,
           "cpu_rate_share_of_link": (split.rates.cpu_gbps(1) / split.rates.zero_copy_gbps
                                      if split.rates.zero_copy_gbps else None),
           "rows": rows(model, g, spec, info, split.rates, args.rounds)}
    doc["load_average"] = [load, load_average()]
    split.close()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{doc['model']} (scale {args.scale:g}) on {doc['device']}, every expert cold; {args.rounds} interleaved "
              f"rounds, median (min-max); {load_span(load)}; "
              f"rates: {doc['rates']}")
        print("| batch | mode | ms | predicted ms | achieved / predicted | split / ideal | split / gpu |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in doc["rows"]:
            for mode in MODES:
                if f"{mode}_error" in r:
                    print(f"| {r['batch']} | {mode} | error: {r[f'{mode}_error']} | | | | |")
                    continue
                med, lo, hi = r[f"{mode}_vs_predicted"]
                extra = "| | |"
                if mode == "split":
                    extra = " | ".join(f"{r[k]:.2f}" if r.get(k) else "-" for k in ("split_vs_ideal", "split_vs_gpu"))
                    extra = f"| {extra} |"
                print(f"| {r['batch']} | {mode} | {r[f'{mode}_ms']:.3f} | {r[f'{mode}_predicted_ms']:.3f} "
                      f"| {med:.2f} ({lo:.2f}-{hi:.2f}) {extra}")
        print("targets: split/ideal <= 1.15; split/gpu < 1 when the CPU rate is >= 20% of the link rate")
    return 1 if any(k.endswith("_error") for r in doc["rows"] for k in r) else 0


if __name__ == "__main__":
    raise SystemExit(main())
