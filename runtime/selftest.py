"""`hotsplit selftest`: the runtime against the all-resident reference on this machine's device,
and its speed (zero-copy read GB/s, step time vs the reference). Returns data; never prints.

Each check runs isolated: any exception it raises (a mismatch, or a device error such as
`torch.AcceleratorError: CUDA error: invalid argument`) becomes that check's FAIL row, naming the
error and where it was raised, and the remaining checks still run.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hotsplit_probes.timing import median_ms

from .bank import zero_copy_view
from .device import DeviceInfo, synchronizer
from .engine import capture_graph
from .fp8 import FP8, RELEASE_FP8, Fp8Experts, Fp8Format
from .kernels import choose_compute
from .model import HotColdMoE
from .moe import LayerWeights, MoEGeometry, ReferenceMoE, Router, make_layer_weights
from .pinned import PinnedAllocator, numa_policy_for
from .precision import MX_GROUP, MXFP4, Mxfp4Experts, Mxfp4Format, StoredExperts, StoredFormat

REFERENCE = "runtime = reference (random hot sets)"
SWAPS = "runtime = reference (swaps mid-run)"
FP8_EXPERTS = "runtime = reference (fp8 experts)"
MXFP4_EXPERTS = "runtime = reference (mxfp4 experts)"
GRAPH = "CUDA graph replay"
ZERO_COPY = "zero-copy read"
STEP_TIME = "step time vs reference (batch 8, 100% hot)"
_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Check:
    name: str
    ok: bool | None  # None: skipped
    value: str
    detail: str = ""
    error: dict | None = None  # the exception that ended the check: type, message, where, traceback

    def to_doc(self) -> dict:
        return dict(self.__dict__)


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message` (a CUDA error's message runs on for several lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def error_site(exc: BaseException) -> str | None:
    """`path:line` of the innermost frame in hotsplit's own code (None when there is none)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(_ROOT) and "site-packages" not in path.parts and path.is_file():
            return f"{path.relative_to(_ROOT)}:{frame.lineno}"
    return None


def failed(name: str, exc: BaseException) -> Check:
    """The FAIL row of check `name` that raised `exc`."""
    site = error_site(exc)
    detail = error_line(exc) + (f" (at {site})" if site else "")
    tb = "".join(traceback.format_exception(exc)[-12:])  # the innermost frames, for a report
    return Check(name, False, "error", detail,
                 {"type": type(exc).__name__, "message": error_line(exc), "at": site, "traceback": tb})


def isolated(name: str, run: Callable[[], Check], info: DeviceInfo) -> Check:
    """Run one check; any exception becomes its FAIL row. The device is synchronised inside, so
    an asynchronous device error is charged to the check whose work raised it."""
    try:
        check = run()
        synchronizer(info)()
    except Exception as exc:  # every kind: an AssertionError, a CUDA error, a bug in the check
        return failed(name, exc)
    return check


def tolerances(dtype: torch.dtype) -> dict:
    """assert_close tolerances per dtype (bf16 keeps 8 mantissa bits; sums of many terms drift)."""
    return {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 1e-2, "rtol": 1e-2},
            torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}[dtype]


def build_pair(geom: MoEGeometry, num_layers: int, hot_LE: np.ndarray, info: DeviceInfo, dtype: torch.dtype,
               seed: int = 0, compute=None, stored: StoredFormat | None = None) -> tuple[HotColdMoE, ReferenceMoE]:
    """A hot/cold model and the all-resident reference with the same weights (`stored`: experts
    block-scaled fp8 or mxfp4 in the banks, their dequantised values in the reference)."""
    layers = [make_layer_weights(geom, seed * 1000 + li, dtype, stored) for li in range(num_layers)]
    alloc = PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
    model = HotColdMoE(layers, geom, hot_LE, info, alloc, compute or choose_compute(info))
    return model, ReferenceMoE(layers, info.device)


def random_hot(num_layers: int, num_experts: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    hot = np.zeros((num_layers, num_experts), dtype=bool)
    n = int(round(fraction * num_experts))
    for li in range(num_layers):
        hot[li, rng.choice(num_experts, n, replace=False)] = True
    return hot


def random_moves(model: HotColdMoE, per_layer: int, rng: np.random.Generator) -> dict[int, list[tuple[int, int]]]:
    """Random hot->cold swaps, at most `per_layer` per layer."""
    moves = {}
    for li, hot in enumerate(model.hot_LE()):
        hot_ids, cold_ids = np.flatnonzero(hot), np.flatnonzero(~hot)
        n = min(per_layer, len(hot_ids), len(cold_ids))
        if n:
            moves[li] = list(zip(rng.choice(hot_ids, n, replace=False).tolist(),
                                 rng.choice(cold_ids, n, replace=False).tolist(), strict=True))
    return moves


def _geom(info: DeviceInfo, router: str, shared: bool) -> MoEGeometry:
    big = info.is_cuda
    return MoEGeometry(hidden=1024 if big else 64, inter=512 if big else 32, num_experts=16, top_k=4,
                       shared_inter=(512 if big else 32) if shared else 0, router=router,
                       n_group=4 if router == "sigmoid" else 1, topk_group=2 if router == "sigmoid" else 1,
                       routed_scaling_factor=2.5 if router == "sigmoid" else 1.0)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def routing_of(ref: ReferenceMoE, x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's routing of x through its stack (ids, weights [L, T, K]), for both sides to
    use. In 16 bits the runtime and the reference round differently (the kernels keep gate and up
    in float32), so an h one ulp apart can tip a near-tie in a later layer's router to another
    expert: an O(1) difference that says nothing about the expert computation being checked."""
    _, ids, ws = ref.routed_step(x_TH)
    return torch.stack(ids), torch.stack(ws)


def assert_matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """got = want within the dtype's tolerance, measured against the size of each row as well as
    each element: an output element near 0 is often the difference of summands of size ~|row|
    (the residual stream, the weighted experts), so 16-bit rounding of those summands shows there
    as an absolute error of a few ulps of the row's largest values."""
    tol = tolerances(dtype)
    g, w = got.float(), want.float()
    row = w.abs().amax(dim=-1, keepdim=True)
    bound = tol["atol"] + tol["rtol"] * (w.abs() + row)
    excess = (g - w).abs() - bound
    if not bool((excess <= 0).all()):  # nan fails too
        i = int(torch.nan_to_num(excess, nan=float("inf")).argmax())
        raise AssertionError(f"runtime differs from the reference: {g.flatten()[i]:.4g} vs {w.flatten()[i]:.4g} "
                             f"(max err {_max_err(g, w):.2e}, bound there {bound.flatten()[i]:.2e})")


def compare_step(model: HotColdMoE, ref: ReferenceMoE, x: torch.Tensor, dtype: torch.dtype) -> float:
    """One step of both on the same routing; raises AssertionError past the tolerance; max err."""
    want, ids, ws = ref.routed_step(x)  # the reference's output, and the routing it took
    got = model.step(x, torch.stack(ids), torch.stack(ws))
    assert_matches(got, want, dtype)
    return _max_err(got, want)


def check_reference(info: DeviceInfo, dtype: torch.dtype, seed: int = 0) -> Check:
    """Random hot sets (none, half, all, random) for both router kinds, shared experts on."""
    rng = np.random.default_rng(seed)
    worst, n = 0.0, 0
    try:
        for router in ("softmax", "sigmoid"):
            g = _geom(info, router, shared=True)
            for frac in (0.0, 0.5, 1.0, rng.random()):
                model, ref = build_pair(g, 2, random_hot(2, g.num_experts, frac, rng), info, dtype, seed)
                x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(n)).to(info.device, dtype)
                worst = max(worst, compare_step(model, ref, x, dtype))
                n += 1
    except AssertionError as exc:
        return Check(REFERENCE, False, f"max err {worst:.2e}", str(exc).splitlines()[0])
    return Check(REFERENCE, True, f"max err {worst:.2e}", f"{n} cases, 2 routers")


def check_fp8(info: DeviceInfo, dtype: torch.dtype, seed: int = 0, stored: StoredFormat = RELEASE_FP8,
              name: str = FP8_EXPERTS) -> Check:
    """Block-scaled fp8 experts (dequantised per tile by the kernels, per expert by the torch
    path) against the reference on their dequantised values: hot sets, then swaps. `stored`:
    experts in another stored format (check_mxfp4)."""
    rng = np.random.default_rng(seed + 3)
    g = _geom(info, "sigmoid", shared=True)
    worst, n = 0.0, 0
    try:
        for frac in (0.0, 0.5):
            model, ref = build_pair(g, 2, random_hot(2, g.num_experts, frac, rng), info, dtype, seed,
                                    stored=stored)
            for _ in range(3):
                x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(200 + n)).to(info.device, dtype)
                worst = max(worst, compare_step(model, ref, x, dtype))
                model.begin_swaps(random_moves(model, 2, rng))
                model.publish_ready(wait=True)
                n += 1
    except AssertionError as exc:
        return Check(name, False, f"max err {worst:.2e}", str(exc).splitlines()[0])
    return Check(name, True, f"max err {worst:.2e}", f"{n} steps, {stored.describe()}, swaps between them")


def check_mxfp4(info: DeviceInfo, dtype: torch.dtype, seed: int = 0) -> Check:
    """MXFP4 experts (e2m1 pairs and e8m0 scales unpacked per tile by the kernels, dequantised per
    expert by the torch path) against the reference on their dequantised values: check_fp8's
    hot sets and swaps."""
    return check_fp8(info, dtype, seed, MXFP4, MXFP4_EXPERTS)


def check_swaps(info: DeviceInfo, dtype: torch.dtype, seed: int = 0, steps: int = 12) -> Check:
    """Swaps started every step; outputs compared while copies are in flight and after publishing."""
    rng = np.random.default_rng(seed + 1)
    g = _geom(info, "sigmoid", shared=True)
    model, ref = build_pair(g, 2, random_hot(2, g.num_experts, 0.5, rng), info, dtype, seed)
    worst, swaps = 0.0, 0
    try:
        for s in range(steps):
            moves = random_moves(model, 2, rng)
            model.begin_swaps(moves)
            swaps += sum(len(m) for m in moves.values())
            model.publish_ready(wait=s % 2 == 0)  # odd steps run with copies possibly in flight
            x = torch.randn(8, g.hidden, generator=torch.Generator().manual_seed(100 + s)).to(info.device, dtype)
            worst = max(worst, compare_step(model, ref, x, dtype))
        model.publish_ready(wait=True)
        for b in model.banks:  # every slot holds the bytes of the expert the table says
            for slot, e in enumerate(b.table.slot2expert_S):
                if not torch.equal(b.hot_SB[slot].cpu(), b.cold_EB[e]):
                    raise AssertionError(f"slot {slot} does not hold expert {e}")
            if not np.array_equal(b.expert2slot_E.cpu().numpy(), b.table.expert2slot_E):
                raise AssertionError("device expert2slot differs from the slot table")
    except AssertionError as exc:
        return Check(SWAPS, False, f"max err {worst:.2e}", str(exc).splitlines()[0])
    return Check(SWAPS, True, f"max err {worst:.2e}", f"{swaps} swaps, {steps} steps")


def check_graph(info: DeviceInfo, dtype: torch.dtype, seed: int = 0) -> Check:
    """Capture one step in a CUDA graph; replay with new inputs and swaps between replays."""
    name = GRAPH
    if not (info.graphs and info.triton):
        return Check(name, None, "skipped", info.reasons.get("graphs") or info.reasons.get("triton", ""))
    rng = np.random.default_rng(seed + 2)
    g = _geom(info, "softmax", shared=True)
    model, ref = build_pair(g, 2, random_hot(2, g.num_experts, 0.5, rng), info, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, g.hidden, generator=gen).to(info.device, dtype)
    ids, w = routing_of(ref, x)  # static inputs of the graph, refilled before each replay
    graph, out = capture_graph(lambda: model.step(x, ids, w), info.device)
    worst = 0.0
    try:
        for s in range(6):
            model.begin_swaps(random_moves(model, 2, rng))
            model.publish_ready(wait=s % 2 == 0)
            x.copy_(torch.randn(x.shape, generator=gen).to(info.device, dtype))
            for static, new in zip((ids, w), routing_of(ref, x), strict=True):
                static.copy_(new)
            graph.replay()
            want = ref.step(x, ids, w)
            worst = max(worst, _max_err(out, want))
            assert_matches(out, want, dtype)
    except AssertionError as exc:
        return Check(name, False, f"max err {worst:.2e}", str(exc).splitlines()[0])
    finally:
        model.publish_ready(wait=True)  # no copy may still write the slots when the model is freed
    return Check(name, True, f"max err {worst:.2e}", "6 replays with swaps between them")


def time_ms(fn: Callable[[], object], info: DeviceInfo, reps: int) -> float:
    """Median wall time of fn in ms (synchronised on CUDA)."""
    return median_ms(fn, reps, synchronizer(info))


def raw_zero_copy_gbps(info: DeviceInfo, n_bytes: int = 1 << 30) -> float:
    """GB/s of the GPU reading pinned host memory in place: a reduction over a pinned buffer's
    device view, median of 5."""
    host = torch.empty(n_bytes // 4, dtype=torch.float32, pin_memory=True).fill_(1.0)
    view = zero_copy_view(host, info.device)
    view.sum()
    return n_bytes / time_ms(view.sum, info, 5) / 1e6


def measure_zero_copy(info: DeviceInfo, n_bytes: int = 1 << 30) -> dict:
    """Raw zero-copy read GB/s (a reduction over a pinned buffer's device view) and the cold expert
    path's GB/s (every expert cold, each read once by the expert kernels)."""
    raw_gbps = raw_zero_copy_gbps(info, n_bytes)
    # The cold path: DeepSeek-V3-sized experts (hidden 7168, moe_intermediate 2048, from
    # deepseek-ai/DeepSeek-V3 config.json), 32 experts, one assignment each, all cold; in bf16
    # and in the release's own format, fp8 with block scales.
    g = MoEGeometry(hidden=7168, inter=2048, num_experts=32, top_k=8, shared_inter=0, router="softmax")
    cold_gbps, cold_bytes = cold_path_gbps(info, g)
    fp8_gbps, fp8_bytes = cold_path_gbps(info, g, RELEASE_FP8)
    return {"raw_gbps": raw_gbps, "raw_bytes": n_bytes, "cold_path_gbps": cold_gbps, "cold_path_bytes": cold_bytes,
            "cold_vs_raw": cold_gbps / raw_gbps, "cold_path_fp8_gbps": fp8_gbps, "cold_path_fp8_bytes": fp8_bytes,
            "cold_fp8_vs_raw": fp8_gbps / raw_gbps}


def filled_stored(fmt: StoredFormat, g: MoEGeometry) -> StoredExperts:
    """A layer's experts stored in `fmt` (fp8 or mxfp4), filled with one value (broadcast: no
    memory until a bank copies them in)."""
    E, I2, H, inter = g.num_experts, 2 * g.inter, g.hidden, g.inter

    def fill(value, dtype, *shape):
        return torch.full((), value, dtype=dtype).expand(*shape)

    if isinstance(fmt, Mxfp4Format):  # e2m1 1.0 in both nibbles, scale 2^-10
        G, u8 = MX_GROUP, torch.uint8
        return Mxfp4Experts(fill(0x22, u8, E, I2, H // G, G // 2), fill(117, u8, E, I2, H // G),
                            fill(0x22, u8, E, H, inter // G, G // 2), fill(117, u8, E, H, inter // G))
    s13, s2 = (E, 2, *fmt.scale_shape(inter, H)), (E, *fmt.scale_shape(H, inter))
    return Fp8Experts(fmt, fill(0.01, FP8, E, I2, H), fill(1e-3, torch.float32, *s13),
                      fill(0.01, FP8, E, H, inter), fill(1e-3, torch.float32, *s2))


def cold_path_gbps(info: DeviceInfo, g: MoEGeometry, fmt: StoredFormat | None = None, reps: int = 5
                   ) -> tuple[float, int]:
    """GB/s of the expert compute reading every expert of one layer from the cold bank (one
    assignment each), and the bytes it reads: experts in bf16, or stored in `fmt` (fp8 or
    mxfp4; the GB/s are of the stored bytes). The values do not matter for bandwidth, so the
    weights are filled, not drawn, and never materialised in bf16 for a stored bank."""
    bf = torch.bfloat16
    E, I2, H = g.num_experts, 2 * g.inter, g.hidden
    if fmt is None:
        w13, w2, q = torch.full((E, I2, H), 0.01, dtype=bf), torch.full((E, H, g.inter), 0.01, dtype=bf), None
    else:  # shape-only stand-ins for the bf16 weights: the bank reads the stored values and scales
        w13, w2 = torch.empty((), dtype=bf).expand(E, I2, H), torch.empty((), dtype=bf).expand(E, H, g.inter)
        q = filled_stored(fmt, g)
    lw = LayerWeights(w13, w2, Router(torch.zeros(E, H), None, g), None, None, q)
    alloc = PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
    model = HotColdMoE([lw], g, np.zeros((1, E), dtype=bool), info, alloc, choose_compute(info))
    del lw, w13, w2, q
    ids = torch.arange(E, device=info.device).view(-1, g.top_k)
    w = torch.full(ids.shape, 1.0 / g.top_k, device=info.device)
    x = torch.randn(ids.shape[0], H, device=info.device, dtype=bf)
    bank = model.banks[0]
    model.compute(x, ids, w, bank)
    ms = time_ms(lambda: model.compute(x, ids, w, bank), info, reps)
    n_bytes = E * bank.expert_bytes
    model = bank = None  # the last references to the banks' slabs: gigabytes of page-locked memory go now
    return n_bytes / ms / 1e6, n_bytes


def step_time_ratio(info: DeviceInfo, dtype: torch.dtype, batch: int, hot_fraction: float, reps: int = 30,
                    geom: MoEGeometry | None = None, num_layers: int = 4, seed: int = 0,
                    fp8: Fp8Format | None = None) -> dict:
    """Median step time of the hot/cold runtime and of the reference, interleaved in one process
    (`fp8`: the runtime's experts in block-scaled fp8, the reference's dequantised in `dtype`)."""
    g = geom or _geom(info, "sigmoid", shared=True)
    rng = np.random.default_rng(seed)
    model, ref = build_pair(g, num_layers, random_hot(num_layers, g.num_experts, hot_fraction, rng), info, dtype,
                            seed, stored=fp8)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, g.hidden, generator=gen).to(info.device, dtype)
    ids_LTK = torch.stack([torch.stack([torch.randperm(g.num_experts, generator=gen)[:g.top_k] for _ in range(batch)])
                           for _ in range(num_layers)]).to(info.device)
    w_LTK = torch.full(ids_LTK.shape, 1.0 / g.top_k, device=info.device)
    for _ in range(3):
        model.step(x, ids_LTK, w_LTK)
        ref.step(x, ids_LTK, w_LTK)
    run_ms, ref_ms = [], []
    for _ in range(reps):  # interleaved so that machine noise hits both alike
        run_ms.append(time_ms(lambda: model.step(x, ids_LTK, w_LTK), info, 1))
        ref_ms.append(time_ms(lambda: ref.step(x, ids_LTK, w_LTK), info, 1))
    r, f = statistics.median(run_ms), statistics.median(ref_ms)
    # The spread of the ratio over the interleaved pairs, 10th to 90th percentile: one preempted
    # step would make min-max say nothing about the other 29.
    pairs = np.array(run_ms) / np.array(ref_ms)
    return {"batch": batch, "hot_fraction": hot_fraction, "runtime_ms": r, "reference_ms": f, "ratio": r / f,
            "ratio_p10": float(np.percentile(pairs, 10)), "ratio_p90": float(np.percentile(pairs, 90))}


def check_zero_copy(info: DeviceInfo, measures: dict) -> Check:
    """The zero-copy read and cold expert path GB/s (kept in `measures["zero_copy"]`)."""
    if not info.zero_copy:
        return Check(ZERO_COPY, None, "skipped", info.reasons.get("zero_copy", ""))
    zc = measures["zero_copy"] = measure_zero_copy(info)
    detail = (f"cold expert path {zc['cold_path_gbps']:.1f} GB/s ({100 * zc['cold_vs_raw']:.0f}% of raw), "
              f"fp8 {zc['cold_path_fp8_gbps']:.1f} GB/s ({100 * zc['cold_fp8_vs_raw']:.0f}%)")
    return Check(ZERO_COPY, True, f"{zc['raw_gbps']:.1f} GB/s raw", detail)


def check_step_time(info: DeviceInfo, dtype: torch.dtype, measures: dict) -> Check:
    """Step time vs the reference (kept in `measures["step_time"]`). Speed is reported, not
    judged: a busy machine must not fail a correctness test."""
    st = measures["step_time"] = step_time_ratio(info, dtype, batch=8, hot_fraction=1.0)
    return Check(STEP_TIME, None, f"x{st['ratio']:.3f}", f"{st['runtime_ms']:.3f} ms vs {st['reference_ms']:.3f} ms")


def run_selftest(info: DeviceInfo, seed: int = 0) -> dict:
    """Every check, each isolated (an exception is that check's FAIL); `ok` is False when any
    check failed (skips do not fail). A measure that raised has no entry in `measures`."""
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    measures: dict = {}
    runs: list[tuple[str, Callable[[], Check]]] = [
        (REFERENCE, lambda: check_reference(info, dtype, seed)),
        (SWAPS, lambda: check_swaps(info, dtype, seed)),
        (FP8_EXPERTS, lambda: check_fp8(info, dtype, seed)),
        (MXFP4_EXPERTS, lambda: check_mxfp4(info, dtype, seed)),
        (GRAPH, lambda: check_graph(info, dtype, seed)),
        (ZERO_COPY, lambda: check_zero_copy(info, measures)),
        (STEP_TIME, lambda: check_step_time(info, dtype, measures)),
    ]
    checks = [isolated(name, run, info) for name, run in runs]
    ok = all(c.ok is not False for c in checks)
    return {"ok": ok, "device": info.to_doc(), "kernel": choose_compute(info).name,
            "checks": [c.to_doc() for c in checks], "measures": measures}
