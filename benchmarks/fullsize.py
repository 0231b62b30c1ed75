"""Full-size experts side by side (`benchmarks/bench_runtime.py --full-size`): the hot/cold
runtime's step against a peer, the same all-resident layers computed through `torch._grouped_mm`
as transformers' `grouped_mm` experts and torchtitan compute them, with the same routing, on the
same device, in one process. Returns data; never prints (`table_lines` renders a document).

Per row (model x batch x hot fraction): step ms of both, the bytes the step must read (distinct
experts x expert bytes) and the GB/s that makes against the device's own copy rate, and the cold
bytes and their GB/s against the zero-copy read of pinned host memory. The weights are filled,
not drawn: values do not change the speed, and drawing gigabytes on a CPU takes minutes.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from hotsplit_probes import timing
from hotsplit_runtime.device import DeviceInfo, clock_of, synchronizer
from hotsplit_runtime.engine import capture_graph
from hotsplit_runtime.fp8 import FP8, RELEASE_FP8, Fp8Experts, Fp8Format
from hotsplit_runtime.kernels import choose_compute
from hotsplit_runtime.model import HotColdMoE
from hotsplit_runtime.moe import LayerWeights, MoEGeometry, Router, expert_counts, rms_norm
from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for
from hotsplit_runtime.precision import E8M0_BIAS, MX_GROUP, Mxfp4Experts, Mxfp4Format
from hotsplit_runtime.selftest import error_line, random_hot, raw_zero_copy_gbps

from hotsplit_cli.hotset.sizes import scaled_dim


@dataclass(frozen=True)
class FullSizeModel:
    name: str
    geom: MoEGeometry  # routed experts only: shared experts cost both sides the same
    layers: int  # MoE layers stacked in one step
    fp8: Fp8Format | None  # the release's expert format (None: the model dtype)


FULL_SIZE_MODELS = (
    # deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, moe_intermediate_size 1408,
    # n_routed_experts 64, num_experts_per_tok 6 (bf16 release).
    FullSizeModel("DeepSeek-V2-Lite", MoEGeometry(hidden=2048, inter=1408, num_experts=64, top_k=6, shared_inter=0,
                                                  router="softmax"), 2, None),
    # deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048,
    # n_routed_experts 256, num_experts_per_tok 8, quantization_config fp8 e4m3 with
    # weight_block_size [128, 128]. One layer: its experts are 11.3 GB in fp8.
    FullSizeModel("DeepSeek-V3 fp8", MoEGeometry(hidden=7168, inter=2048, num_experts=256, top_k=8, shared_inter=0,
                                                 router="sigmoid"), 1, RELEASE_FP8),
)
BATCHES = (1, 8, 32, 128)
HOT_FRACTIONS = (1.0, 0.25, 0.0)
TARGETS = {
    "peer": "100% hot, batch >= 32: hotsplit within 1.2x of grouped_mm",
    "cold": "0% hot: cold GB/s >= 90% of the zero-copy read",
    "batch1": "batch 1: hotsplit <= 1.5x bytes / bandwidth + launch latency",
}
# Exact in bf16 and in e4m3 x float32 scale (2^-6 x 2^-4), so both sides hold the same weights.
WEIGHT = 2.0 ** -10
FP8_VALUE, FP8_SCALE = 2.0 ** -6, 2.0 ** -4
MXFP4_BYTE, MXFP4_SCALE = 0x22, E8M0_BIAS - 10  # e2m1 1.0 in both nibbles, times 2^-10: WEIGHT again


def scaled_model(spec: FullSizeModel, scale: float) -> FullSizeModel:
    """The same model with hidden sizes shrunk by `scale` (1: the real sizes)."""
    g = spec.geom
    return dataclasses.replace(spec, geom=dataclasses.replace(g, hidden=scaled_dim(g.hidden, scale),
                                                              inter=scaled_dim(g.inter, scale)))


def grouped_mm_experts(x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor, w13_EIH: torch.Tensor,
                       w2_EHI: torch.Tensor) -> torch.Tensor:
    """The peer: routed SwiGLU experts through `torch._grouped_mm`, as transformers'
    `grouped_mm_experts_forward` computes them. Assignments sorted by expert, group offsets the
    int32 cumulative counts, gate/up in one grouped mm, silu(gate) * up, down in a second, each
    row scaled by its routing weight, scattered back and summed over top-k in float32.
    Shapes: x [T, H], ids and w [T, K], w13 [E, 2I, H], w2 [E, H, I]; returns [T, H]. No host
    synchronisation (capturable in a CUDA graph)."""
    T, K = ids_TK.shape
    flat_A = ids_TK.reshape(-1)
    order_A = torch.argsort(flat_A, stable=True)
    offs_E = torch.cumsum(expert_counts(ids_TK, w13_EIH.shape[0]), 0, dtype=torch.int32)
    x_AH = x_TH[order_A // K].to(w13_EIH.dtype)
    gate_AI, up_AI = torch._grouped_mm(x_AH, w13_EIH.transpose(-2, -1), offs=offs_E).chunk(2, dim=-1)
    y_AH = torch._grouped_mm(F.silu(gate_AI) * up_AI, w2_EHI.transpose(-2, -1), offs=offs_E)
    y_AH = y_AH.float() * w_TK.reshape(-1)[order_A, None].float()
    out_AH = torch.empty_like(y_AH).index_copy_(0, order_A, y_AH)  # back to assignment order
    return out_AH.view(T, K, -1).sum(dim=1).to(x_TH.dtype)


def peer_step(x_TH: torch.Tensor, ids_LTK: torch.Tensor, w_LTK: torch.Tensor,
              weights: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The peer's stack, as `HotColdMoE.step` computes it: h = h + experts(rms_norm(h)) per layer."""
    h = x_TH
    for li, (w13, w2) in enumerate(weights):
        h = h + grouped_mm_experts(rms_norm(h), ids_LTK[li], w_LTK[li], w13, w2)
    return h


def per_call_ms(fn: Callable[[], object], info: DeviceInfo, budget_ms: float = 300.0) -> float:
    """Median ms per call of `fn` on `info`'s device (probes/timing.py's per_call_ms, CUDA events
    on a GPU)."""
    return timing.per_call_ms(fn, clock_of(info), synchronizer(info), budget_ms)


def graphed(fn: Callable[[], torch.Tensor], info: DeviceInfo) -> tuple[Callable[[], torch.Tensor], str]:
    """`fn` captured in a CUDA graph (returns a replay that gives the static output), or `fn`
    itself where graphs do not run or the capture failed; and which of them, with the reason."""
    if not info.graphs:
        return fn, "eager"
    try:
        graph, out = capture_graph(fn, info.device)
    except Exception as exc:  # e.g. an op that synchronises: measured eagerly instead
        torch.cuda.synchronize(info.device)
        return fn, f"eager ({error_line(exc)})"

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay, "graph"


def measure_d2d_gbps(info: DeviceInfo, n_bytes: int) -> float:
    """The device's memory copy rate: bytes read plus bytes written per second by `dst.copy_(src)`
    of `n_bytes`, in GB/s."""
    src = torch.ones(n_bytes, dtype=torch.uint8, device=info.device)
    dst = torch.empty_like(src)
    return 2 * n_bytes / per_call_ms(lambda: dst.copy_(src), info) / 1e6


def measure_launch_ms(info: DeviceInfo) -> float:
    """The time one near-empty step costs (a graph replay on a GPU): the launch latency that a
    step's bytes-over-bandwidth time does not include."""
    x = torch.zeros(16, device=info.device)
    step, _ = graphed(lambda: x.add_(1.0), info)
    return per_call_ms(step, info, budget_ms=50.0)


@dataclass
class Rates:
    """The device's reference rates (GB/s) and launch latency, each None with a reason when it
    could not be measured."""

    d2d_gbps: float | None
    zero_copy_gbps: float | None
    zero_copy_source: str
    launch_ms: float | None
    reasons: dict[str, str]


def measure_rates(info: DeviceInfo, zero_copy_gbps: float | None = None, zero_copy_source: str = "",
                  d2d_bytes: int | None = None) -> Rates:
    """d2d copy rate, launch latency and zero-copy read, each isolated. `zero_copy_gbps` given
    (the probe's, from platform.json) is used as is; else it is measured here when the device can."""
    reasons: dict[str, str] = {}

    def attempt(key: str, fn: Callable[[], float]) -> float | None:
        try:
            return fn()
        except Exception as exc:
            reasons[key] = error_line(exc)
            return None

    n = d2d_bytes or ((1 << 30) if info.is_cuda else (64 << 20))
    d2d = attempt("d2d_gbps", lambda: measure_d2d_gbps(info, n))
    launch = attempt("launch_ms", lambda: measure_launch_ms(info))
    if zero_copy_gbps is None:
        if info.zero_copy:
            zero_copy_gbps = attempt("zero_copy_gbps", lambda: raw_zero_copy_gbps(info))
            zero_copy_source = "measured in this process (a reduction over pinned host memory)"
        else:
            reasons["zero_copy_gbps"] = info.reasons.get("zero_copy", "no zero-copy reads on this device")
            zero_copy_source = "none"
    return Rates(d2d, zero_copy_gbps, zero_copy_source, launch, reasons)


def filled_layer(g: MoEGeometry, dtype: torch.dtype, fp8: Fp8Format | Mxfp4Format | None) -> LayerWeights:
    """One layer's experts as broadcast scalars (no memory): the bank copies them into its blobs.
    With `fp8` (a stored format: fp8 or mxfp4) the stored values and scales, the bf16 tensors only
    give shapes."""
    E, I2, H, inter = g.num_experts, 2 * g.inter, g.hidden, g.inter
    if isinstance(fp8, Mxfp4Format):
        return _filled_mxfp4(g, dtype)
    if fp8 is None:
        w13 = torch.full((), WEIGHT, dtype=dtype).expand(E, I2, H)
        w2 = torch.full((), WEIGHT, dtype=dtype).expand(E, H, inter)
        q = None
    else:
        w13, w2 = torch.empty((), dtype=dtype).expand(E, I2, H), torch.empty((), dtype=dtype).expand(E, H, inter)

        def fill(value, dt, *shape):
            return torch.full((), value, dtype=dt).expand(*shape)

        q = Fp8Experts(fp8, fill(FP8_VALUE, FP8, E, I2, H), fill(FP8_SCALE, torch.float32, E, 2,
                                                                   *fp8.scale_shape(inter, H)),
                       fill(FP8_VALUE, FP8, E, H, inter), fill(FP8_SCALE, torch.float32, E,
                                                                *fp8.scale_shape(H, inter)))
    return LayerWeights(w13, w2, Router(torch.zeros(E, H), None, g), None, None, q)


def _filled_mxfp4(g: MoEGeometry, dtype: torch.dtype) -> LayerWeights:
    """MXFP4 experts that dequantise to WEIGHT, in the release layout's bytes."""
    E, I2, H, inter, G = g.num_experts, 2 * g.inter, g.hidden, g.inter, MX_GROUP
    u8 = torch.full((), 0, dtype=torch.uint8)
    q = Mxfp4Experts((u8 + MXFP4_BYTE).expand(E, I2, H // G, G // 2), (u8 + MXFP4_SCALE).expand(E, I2, H // G),
                     (u8 + MXFP4_BYTE).expand(E, H, inter // G, G // 2), (u8 + MXFP4_SCALE).expand(E, H, inter // G))
    w13, w2 = torch.empty((), dtype=dtype).expand(E, I2, H), torch.empty((), dtype=dtype).expand(E, H, inter)
    return LayerWeights(w13, w2, Router(torch.zeros(E, H), None, g), None, None, q)


def routing(g: MoEGeometry, layers: int, batch: int, device: torch.device, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random routing: each token picks top_k distinct experts, weights 1 / top_k.
    Returns ids int64 [L, T, K] and weights float32 [L, T, K] on `device`."""
    gen = torch.Generator().manual_seed(seed * 1000 + batch)
    ids = torch.rand(layers, batch, g.num_experts, generator=gen).topk(g.top_k, dim=-1).indices
    return ids.to(device), torch.full(ids.shape, 1.0 / g.top_k, device=device)


def read_bytes(ids_LTK: torch.Tensor, hot_LE: np.ndarray, expert_bytes: int) -> tuple[int, int]:
    """Bytes a step must read (each distinct expert of each layer once) and the cold part of them."""
    used_LE = np.zeros(hot_LE.shape, dtype=bool)
    for li, ids in enumerate(ids_LTK.cpu().numpy()):
        used_LE[li, np.unique(ids)] = True
    return int(used_LE.sum()) * expert_bytes, int((used_LE & ~hot_LE).sum()) * expert_bytes


def judge(row: dict, rates: Rates) -> dict[str, bool]:
    """Which targets apply to this row and whether it meets them."""
    out = {}
    if row["hot_fraction"] == 1.0 and row["batch"] >= 32 and row.get("peer_ms"):
        out["peer"] = row["step_ms"] <= 1.2 * row["peer_ms"]
    if row["hot_fraction"] == 0.0 and rates.zero_copy_gbps and row["cold_bytes"]:
        out["cold"] = row["cold_gbps"] >= 0.9 * rates.zero_copy_gbps
    if row["batch"] == 1 and row.get("ideal_ms") is not None and rates.launch_ms is not None:
        out["batch1"] = row["step_ms"] <= 1.5 * row["ideal_ms"] + rates.launch_ms
    return out


class _Peer:
    """The peer's step per batch, measured once and reused by every hot fraction."""

    def __init__(self, weights: list[tuple[torch.Tensor, torch.Tensor]], info: DeviceInfo, budget_ms: float):
        self.weights, self.info, self.budget_ms = weights, info, budget_ms
        self.by_batch: dict[int, tuple[float, torch.Tensor, str] | str] = {}  # str: the error

    def measure(self, batch: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> dict:
        """peer_ms, peer_graph and the output (`peer_out`), or `peer_error`."""
        if batch not in self.by_batch:
            try:
                fn, mode = graphed(lambda: peer_step(x, ids, w, self.weights), self.info)
                ms = per_call_ms(fn, self.info, self.budget_ms)
                self.by_batch[batch] = (ms, fn().clone(), mode)
            except Exception as exc:  # kept as text: a traceback would keep the weights alive
                self.by_batch[batch] = error_line(exc)
        got = self.by_batch[batch]
        if isinstance(got, str):
            return {"peer_error": got}
        return {"peer_ms": got[0], "peer_out": got[1], "peer_graph": got[2]}


def measure_row(model: HotColdMoE, peer: _Peer, spec: FullSizeModel, batch: int, rates: Rates,
                budget_ms: float) -> dict:
    """One row: the hot/cold step and the peer on the same input and routing."""
    info, g = model.info, spec.geom
    dtype = model.banks[0].compute_dtype
    x = torch.randn(batch, g.hidden, generator=torch.Generator().manual_seed(batch)).to(info.device, dtype)
    ids, w = routing(g, spec.layers, batch, info.device)
    hot_LE = model.hot_LE()
    expert_bytes = model.banks[0].expert_bytes
    total, cold = read_bytes(ids, hot_LE, expert_bytes)
    step, mode = graphed(lambda: model.step(x, ids, w), info)
    step_ms = per_call_ms(step, info, budget_ms)
    got = step().float()
    row = {"hit_rate": float(np.take_along_axis(hot_LE, ids.cpu().numpy().reshape(spec.layers, -1),
                                                                axis=1).mean()),
           "step_ms": step_ms, "graph": mode, "read_bytes": total, "read_gbps": total / step_ms / 1e6,
           "cold_bytes": cold, "cold_gbps": cold / step_ms / 1e6}
    row["read_vs_d2d"] = row["read_gbps"] / rates.d2d_gbps if rates.d2d_gbps else None
    row["cold_vs_zero_copy"] = row["cold_gbps"] / rates.zero_copy_gbps if rates.zero_copy_gbps and cold else None
    if rates.d2d_gbps and (cold == 0 or rates.zero_copy_gbps):
        row["ideal_ms"] = (total - cold) / rates.d2d_gbps / 1e6 + (cold / rates.zero_copy_gbps / 1e6 if cold else 0.0)
        row["step_vs_ideal"] = step_ms / row["ideal_ms"]
    row.update(peer.measure(batch, x, ids, w))  # a peer that failed leaves hotsplit's figures standing
    if "peer_ms" in row:
        want = row.pop("peer_out").float()
        row["step_vs_peer"] = step_ms / row["peer_ms"]
        row["max_rel_diff"] = float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))
    return row


def model_rows(spec: FullSizeModel, info: DeviceInfo, rates: Rates, batches=BATCHES, hot_fractions=HOT_FRACTIONS,
               budget_ms: float = 300.0, seed: int = 0) -> tuple[dict, list[dict]]:
    """Every (hot fraction, batch) row of one model, each isolated: an exception is that row's
    `error`. Returns the model's description and its rows; frees its memory before returning."""
    g, L = spec.geom, spec.layers
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    desc = {"name": spec.name, "geometry": dataclasses.asdict(g), "layers": L, "dtype": str(dtype),
            "experts": spec.fp8.describe() if spec.fp8 else str(dtype).replace("torch.", ""),
            "peer_experts": str(dtype).replace("torch.", "")}
    rows: list[dict] = []

    def blank(hot, batch, **more):
        return {"model": spec.name, "hot_fraction": hot, "batch": batch, **more}

    alloc = PinnedAllocator(pin=info.pinned, numa=numa_policy_for("preferred", info.numa_node,
                                                                       info.reasons.get("numa_node")))
    model = peer = None
    try:
        lw = filled_layer(g, dtype, spec.fp8)
        model = HotColdMoE([lw] * L, g, np.zeros((L, g.num_experts), dtype=bool), info, alloc, choose_compute(info))
        desc["expert_bytes"] = model.banks[0].expert_bytes
        desc["peer_expert_bytes"] = g.blob_elems * dtype.itemsize
        peer = _Peer([(torch.full((g.num_experts, 2 * g.inter, g.hidden), WEIGHT, dtype=dtype, device=info.device),
                       torch.full((g.num_experts, g.hidden, g.inter), WEIGHT, dtype=dtype, device=info.device))
                      for _ in range(L)], info, budget_ms)
    except Exception as exc:
        desc["error"] = error_line(exc)
        rows = [blank(h, b, error=f"setup: {error_line(exc)}") for h in hot_fractions for b in batches]
    else:
        rng = np.random.default_rng(seed)
        for hot in hot_fractions:
            try:
                for bank, hot_E in zip(model.banks, random_hot(L, g.num_experts, hot, rng), strict=True):
                    bank.set_hot(hot_E)
            except Exception as exc:
                rows += [blank(hot, b, error=f"hot set: {error_line(exc)}") for b in batches]
                continue
            for batch in batches:
                try:
                    row = blank(hot, batch, **measure_row(model, peer, spec, batch, rates, budget_ms))
                    row["targets"] = judge(row, rates)
                except Exception as exc:
                    row = blank(hot, batch, error=error_line(exc))
                rows.append(row)
    finally:
        model = peer = None  # the last references to the banks' slabs and the device weights
        gc.collect()
        try:
            if info.is_cuda:
                torch.cuda.empty_cache()
        except Exception as exc:
            desc["release_error"] = error_line(exc)
    rows.sort(key=lambda r: (r["batch"], -r["hot_fraction"]))
    return desc, rows


def full_size_doc(info: DeviceInfo, models=FULL_SIZE_MODELS, batches=BATCHES, hot_fractions=HOT_FRACTIONS,
                  scale: float = 1.0, zero_copy_gbps: float | None = None, zero_copy_source: str = "",
                  budget_ms: float = 300.0) -> dict:
    """The whole side-by-side document: rates, then every model's rows (each row isolated)."""
    rates = measure_rates(info, zero_copy_gbps, zero_copy_source)
    doc = {"full_size": scale == 1.0, "scale": scale, "device": info.name, "kernel": choose_compute(info).name,
           "d2d_copy_gbps": rates.d2d_gbps, "zero_copy_gbps": rates.zero_copy_gbps,
           "zero_copy_source": rates.zero_copy_source, "launch_ms": rates.launch_ms, "reasons": rates.reasons,
           "targets": TARGETS, "models": [], "rows": []}
    for spec in models:
        desc, rows = model_rows(scaled_model(spec, scale), info, rates, batches, hot_fractions, budget_ms)
        doc["models"].append(desc)
        doc["rows"] += rows
    doc["errors"] = sum("error" in r for r in doc["rows"])
    return doc


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def table_lines(doc: dict) -> list[str]:
    """The document as a markdown table with the targets next to the results."""
    lines = [f"full-size experts side by side on {doc['device']} ({doc['kernel']}, scale {doc['scale']}): "
             f"d2d copy {_f(doc['d2d_copy_gbps'], '.1f')} GB/s (read + write), zero-copy read "
             f"{_f(doc['zero_copy_gbps'], '.1f')} GB/s ({doc['zero_copy_source']}), launch {_f(doc['launch_ms'])} ms"]
    lines += [f"  {k}: {why}" for k, why in doc["reasons"].items()]
    for m in doc["models"]:
        g = m["geometry"]
        lines.append(f"{m['name']}: {m['layers']} MoE layer(s), hidden {g['hidden']}, inter {g['inter']}, "
                     f"{g['num_experts']} experts, top-{g['top_k']}; hotsplit experts {m['experts']} "
                     f"({_f(m.get('expert_bytes'), ',')} B each), grouped_mm peer {m['peer_experts']}"
                     + (f"; error: {m['error']}" if "error" in m else ""))
    lines += ["| model | batch | hot | hotsplit ms | grouped_mm ms | ratio | read MB | GB/s | of d2d | cold MB "
              "| cold GB/s | of zero-copy | x ideal | targets |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in doc["rows"]:
        head = f"| {r['model']} | {r['batch']} | {100 * r['hot_fraction']:.0f}% "
        if "error" in r:
            lines.append(head + f"| error: {r['error']} |" + " |" * 10)
            continue
        targets = ", ".join(f"{k} {'ok' if ok else 'MISSED'}" for k, ok in r["targets"].items()) or "-"
        lines.append(head + f"| {r['step_ms']:.3f} | {_f(r.get('peer_ms'))} | {_f(r.get('step_vs_peer'), '.2f')} "
                     f"| {r['read_bytes'] / 1e6:.1f} | {r['read_gbps']:.1f} | {_f(r['read_vs_d2d'], '.0%')} "
                     f"| {r['cold_bytes'] / 1e6:.1f} | {r['cold_gbps']:.1f} | {_f(r['cold_vs_zero_copy'], '.0%')} "
                     f"| {_f(r.get('step_vs_ideal'), '.2f')} | {targets} |"
                     + (f" grouped_mm error: {r['peer_error']}" if "peer_error" in r else ""))
    lines += [f"target {k}: {why}" for k, why in doc["targets"].items()]
    return lines
