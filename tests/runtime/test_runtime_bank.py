"""The hot/cold model equals the all-resident reference: random hot sets, every swap, both routers,
shared experts; the Triton kernels (interpreted on a CPU); CUDA-only paths skip without CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.engine import ArraySource, Engine
from hotsplit_runtime.fp8 import FP8, Fp8Format, dequantize, quantize
from hotsplit_runtime.moe import MoEGeometry, make_layer_weights
from hotsplit_runtime.precision import MXFP4
from hotsplit_runtime.selftest import build_pair, random_hot, random_moves, tolerances

from tests.conftest import STARTED_INTERPRETED, cpu_without_triton, interpreter_mode
from tests.runtime.reference import dense_reference

torch.set_num_threads(1)
CPU = cpu_without_triton()
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def geom(router, shared=True, **kw):
    g = dict(hidden=32, inter=16, num_experts=8, top_k=2, shared_inter=16 if shared else 0, router=router)
    if router == "sigmoid":
        g.update(n_group=4, topk_group=2, routed_scaling_factor=2.5)
    g.update(kw)
    return MoEGeometry(**g)


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_hot_sets_equal_reference(router, shared, seed):
    rng = np.random.default_rng(seed)
    g = geom(router, shared)
    model, ref = build_pair(g, 3, random_hot(3, 8, rng.random(), rng), CPU, torch.float32, seed)
    x = torch.randn(7, g.hidden, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))


# Blocks that leave partial blocks in every dimension (hidden 32, inter 16 per gate/up half).
FP8_BLOCKS = Fp8Format((8, 12))


@pytest.mark.parametrize("fmt", [FP8_BLOCKS, Fp8Format(None)], ids=["blocks", "per-tensor"])
def test_fp8_experts_equal_reference_on_their_dequantised_values(fmt):
    rng = np.random.default_rng(5)
    g = geom("sigmoid")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32, stored=fmt)
    bank = model.banks[0]
    assert bank.cold_EB.dtype == torch.uint8 and bank.compute_dtype == torch.float32
    assert bank.fp8_meta is not None and bank.w2_offset == 2 * 16 * 32  # fp8 w13 bytes
    for step in range(4):
        x = torch.randn(6, g.hidden, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))
    # Quantised values really are fp8: the reference's weights are dequantised e4m3.
    w = ref.layers[0].w13_EIH
    assert not torch.equal(w, make_layer_weights(g, 0, torch.float32).w13_EIH)


def test_fp8_quantize_round_trips_within_e4m3_precision():
    w = torch.randn(20, 30, generator=torch.Generator().manual_seed(0))
    q, s = quantize(w, FP8_BLOCKS)
    assert q.dtype == FP8 and s.shape == (3, 3)
    back = dequantize(q, s, FP8_BLOCKS, torch.float32)
    assert ((back - w).abs() <= w.abs() * 2 ** -3 + 1e-6).all()  # e4m3 keeps 3 mantissa bits
    assert torch.equal(dequantize(*quantize(back, FP8_BLOCKS), FP8_BLOCKS, torch.float32), back)


def test_the_release_fp8_format_is_the_one_plans_charge_scales_for():
    from hotsplit_runtime.fp8 import RELEASE_FP8

    from hotsplit_cli.config.recipe import parse_recipe
    from hotsplit_cli.hotset.sizes import expert_bytes_per_rank

    # DeepSeek-V3's expert (hidden 7168, moe_intermediate 2048) under its weight_block_size [128, 128]:
    # gate and up [2048, 7168] -> 16 x 56 fp32 scales each, down [7168, 2048] -> 56 x 16.
    assert RELEASE_FP8.scale_shape(2048, 7168) == (16, 56) and RELEASE_FP8.scale_shape(7168, 2048) == (56, 16)
    model = dict(hidden_size=7168, moe_intermediate_size=2048, num_hidden_layers=1, num_experts=8, top_k=2,
                 expert_dtype="fp8", total_params=1e12)
    assert expert_bytes_per_rank(parse_recipe({"model": model})) == 3 * 7168 * 2048 + 3 * 16 * 56 * 4
    assert RELEASE_FP8.describe() == "fp8 e4m3, 128x128 block scales"
    assert Fp8Format(None).describe() == "fp8 e4m3, one scale per tensor"


def test_cold_path_measure_reads_every_expert_once():
    from hotsplit_runtime.selftest import cold_path_gbps

    g = geom("softmax", shared=False, num_experts=8, top_k=4)
    gbps, n_bytes = cold_path_gbps(CPU, g, reps=2)
    gbps8, n_bytes8 = cold_path_gbps(CPU, g, FP8_BLOCKS, reps=2)
    assert gbps > 0 and gbps8 > 0
    assert n_bytes == 8 * 3 * 32 * 16 * 2  # bf16
    # e4m3 w13 [32, 32] and w2 [32, 16], float32 scales [2, 2, 3] and [4, 2]: 1536 + 48 + 32 bytes
    assert n_bytes8 == 8 * (3 * 32 * 16 + 2 * 2 * 3 * 4 + 4 * 2 * 4)
    g4 = geom("softmax", shared=False, num_experts=8, top_k=4, hidden=64, inter=32)
    gbps4, n_bytes4 = cold_path_gbps(CPU, g4, MXFP4, reps=2)
    # e2m1 pairs of w13 [64, 64] and w2 [64, 32], an e8m0 byte per 32 inputs: 3072 + 96 bytes
    assert gbps4 > 0 and n_bytes4 == 8 * (3 * 64 * 32 // 2 + 3 * 64 * 32 // 32)


def test_bf16_equal_reference_within_dtype_tolerance():
    g = geom("sigmoid")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, np.random.default_rng(0)), CPU, torch.bfloat16)
    x = torch.randn(4, g.hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.bfloat16))


def test_every_swap_keeps_outputs_equal_and_maps_consistent():
    rng = np.random.default_rng(3)
    g = geom("softmax")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32)
    for _ in range(10):
        model.begin_swaps(random_moves(model, 2, rng))
        for b in model.banks:
            assert np.array_equal(b.expert2slot_E.numpy(), b.table.expert2slot_E)
            for slot, e in enumerate(b.table.slot2expert_S):
                assert torch.equal(b.hot_SB[slot], b.cold_EB[e])
        x = torch.randn(5, g.hidden)
        torch.testing.assert_close(model.step(x), ref.step(x))


def test_outputs_equal_reference_after_every_swap_of_a_dynamic_run():
    from hotsplit_cli.config.knobs import resolve_knobs
    from hotsplit_cli.traffic.synthetic import SyntheticTraffic, zipf_shares

    g = geom("sigmoid")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.25, np.random.default_rng(0)), CPU, torch.float32)
    traffic = SyntheticTraffic(zipf_shares(2, 8, 1.2, 1), 2, 6, drift_every=6, seed=1)

    def gen():
        while True:
            yield traffic.next_step(), None

    knobs = resolve_knobs({"dyn_steps": 3, "dyn_max_swaps": 1, "dyn_margin": 1.0}, env={})
    eng = Engine(model, ArraySource("synthetic", 6, gen()), knobs, expert_bytes=1000)
    probe = torch.randn(4, g.hidden)
    checked = []

    def on_record(rec):
        model.publish_ready(wait=True)
        torch.testing.assert_close(model.step(probe), ref.step(probe))
        checked.append(rec.swaps)

    summary = eng.run(30, on_record)
    assert summary.swaps > 0 and sum(checked) == summary.swaps


def test_triton_kernels_equal_reference_in_the_interpreter(triton_interpreted):
    from hotsplit_runtime.kernels import TritonExperts

    rng = np.random.default_rng(5)
    g = geom("sigmoid", hidden=48, inter=24)
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32,
                            compute=TritonExperts(block_i=16, block_h=32))
    for _ in range(2):
        x = torch.randn(3, g.hidden)
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))
    ids = torch.tensor([[[0, -1], [3, 5], [7, 1]]] * 2)  # padding is ignored
    w = torch.rand(2, 3, 2)
    x = torch.randn(3, g.hidden)
    torch.testing.assert_close(model.step(x, ids, w), ref.step(x, ids, w), **tolerances(torch.float32))


@cuda
def test_cuda_zero_copy_view_reads_pinned_memory_in_place():
    from hotsplit_runtime.bank import zero_copy_view

    host = torch.arange(1024, dtype=torch.float32).pin_memory()
    view = zero_copy_view(host, torch.device("cuda"))
    assert view.is_cuda and view.data_ptr() == host.data_ptr()
    host[3] = -7.0  # a host write is seen by the device: same bytes, no copy
    assert float(view[3]) == -7.0


@cuda
def test_cuda_graph_replay_equals_reference():
    from hotsplit_runtime.selftest import check_graph

    info = choose_device("cuda")
    result = check_graph(info, torch.bfloat16)
    assert result.ok is not False, result.detail


@cuda
def test_cuda_swaps_in_flight_equal_reference():
    from hotsplit_runtime.selftest import check_reference, check_swaps

    info = choose_device("cuda")
    for check in (check_reference(info, torch.bfloat16), check_swaps(info, torch.bfloat16)):
        assert check.ok, check.detail


@cuda
def test_cuda_fp8_and_mxfp4_experts_equal_reference():
    """The kernels' fp8 and mxfp4 tiles on a GPU, in bf16, hot and cold, with swaps."""
    from hotsplit_runtime.selftest import check_fp8, check_mxfp4

    info = choose_device("cuda")
    for check in (check_fp8(info, torch.bfloat16), check_mxfp4(info, torch.bfloat16)):
        assert check.ok, check.detail


@pytest.mark.parametrize("block_t", [1, 4, 16])
@pytest.mark.parametrize("seed", range(3))
def test_align_blocks_groups_each_assignment_once_by_expert(block_t, seed):
    from hotsplit_runtime.kernels import align_blocks, max_blocks

    g = torch.Generator().manual_seed(seed)
    E, A = 8, 37  # not a multiple of any block size
    ids = torch.randint(0, 3, (A,), generator=g) * 2  # experts 0, 2, 4 only: the rest get no tokens
    ids[torch.rand(A, generator=g) < 0.2] = -1
    b = align_blocks(ids, E, block_t)
    assert b.num_blocks == max_blocks(A, E, block_t)
    seen = []
    for e, start, n in zip(b.expert_N.tolist(), b.start_N.tolist(), b.count_N.tolist(), strict=True):
        assert 0 <= n <= block_t and (n == 0) == (e == -1)
        rows = b.order_A[start:start + n]
        assert bool((ids[rows] == e).all())
        seen += rows.tolist()
    assert sorted(seen) == torch.nonzero(ids >= 0).flatten().tolist()  # padding in no block
    counts = torch.bincount(ids[ids >= 0], minlength=E)
    per_expert = torch.bincount(b.expert_N[b.expert_N >= 0].long(), minlength=E)
    # An expert's weights are read once per block: ceil(n / block_t) times, none for an idle expert.
    assert per_expert.tolist() == ((counts + block_t - 1) // block_t).tolist()


def test_align_blocks_all_padding_has_no_live_block():
    from hotsplit_runtime.kernels import align_blocks

    b = align_blocks(torch.full((6,), -1), 4, 4)
    assert b.count_N.tolist() == [0] * b.num_blocks and b.expert_N.tolist() == [-1] * b.num_blocks


def _kernel_case(hot_fraction, dtype=torch.float32, seed=0, stored=None, hidden=48, inter=24):
    g = geom("softmax", shared=False, hidden=hidden, inter=inter)
    model, ref = build_pair(g, 1, random_hot(1, 8, hot_fraction, np.random.default_rng(seed)), CPU, dtype, seed,
                            stored=stored)
    lw = ref.layers[0]
    return g, model.banks[0], lambda x, ids, w: dense_reference(x, ids, w, lw.w13_EIH, lw.w2_EHI)


# Blocks below 16 take the broadcast-multiply path, 16 and up tl.dot.
BLOCKS = {"small": dict(block_t=4, block_i=8, block_h=16), "dot": dict(block_t=16, block_i=16, block_h=32)}


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("hot_fraction", [0.0, 0.5, 1.0])
def test_triton_grouped_kernels_many_tokens_per_expert(triton_interpreted, blocks, hot_fraction):
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, reference = _kernel_case(hot_fraction)
    T, K = 21, 3  # A = 63: several full blocks of one expert, and partial ones
    gen = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.full((T,), 3), torch.randint(0, 8, (T,), generator=gen), torch.full((T,), 6)], dim=1)
    ids[::5, 1] = -1  # padding mixed in
    ids[ids == 5] = 4  # expert 5 gets no token
    w = torch.rand(T, K, generator=gen)
    x = torch.randn(T, g.hidden, generator=gen)
    y = TritonExperts(**BLOCKS[blocks])(x, ids, w, bank)
    torch.testing.assert_close(y, reference(x, ids, w), **tolerances(torch.float32))


@pytest.mark.parametrize("blocks", BLOCKS)
def test_triton_grouped_kernels_all_padding_gives_zero(triton_interpreted, blocks):
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, _ = _kernel_case(0.5)
    ids = torch.full((5, 2), -1)
    w = torch.full((5, 2), float("nan"))  # never read: padding is in no block
    y = TritonExperts(**BLOCKS[blocks])(torch.randn(5, g.hidden), ids, w, bank)
    assert torch.equal(y, torch.zeros(5, g.hidden))


def test_triton_grouped_kernels_follow_swaps_and_single_token(triton_interpreted):
    from hotsplit_runtime.kernels import TritonExperts

    rng = np.random.default_rng(2)
    g, bank, reference = _kernel_case(0.5, seed=2)
    compute = TritonExperts(block_t=16, block_i=16, block_h=16)
    for _ in range(3):
        for T in (1, 9):
            ids = torch.from_numpy(rng.integers(0, 8, (T, 2)))
            w, x = torch.rand(T, 2), torch.randn(T, g.hidden)
            torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(torch.float32))
        hot, cold = np.flatnonzero(bank.table.hot_E), np.flatnonzero(~bank.table.hot_E)
        bank.begin_swaps([(int(rng.choice(hot)), int(rng.choice(cold)))])


def test_triton_grouped_kernels_float16_multiply_in_weight_dtype(triton_interpreted):
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, reference = _kernel_case(0.5, torch.float16)
    compute = TritonExperts(block_t=16, block_i=16, block_h=16)
    assert compute.native_dot(torch.float16) and not compute.native_dot(torch.float32)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 8, (19, 2), generator=gen)
    w, x = torch.rand(19, 2, generator=gen), torch.randn(19, g.hidden, generator=gen).half()
    torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(torch.float16))


@pytest.mark.parametrize("fmt, tiled", [(FP8_BLOCKS, (False, False)), (Fp8Format((32, 32)), (True, True)),
                                        (Fp8Format(None), (True, True))], ids=["blocks", "tile-blocks", "per-tensor"])
@pytest.mark.parametrize("split_h", [1, 3])
def test_triton_grouped_kernels_fp8_dequantise_tiles_as_they_read_them(triton_interpreted, fmt, tiled, split_h):
    """Blocks of 8x12 cut the tiles: each element takes its own scale. Blocks of 32x32 (and a
    per-tensor scale) hold whole tiles: one scale per tile, on its partial sums."""
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, reference = _kernel_case(0.5, stored=fmt)
    assert bank.fp8_meta is not None
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 8, (9, 2), generator=gen)
    w, x = torch.rand(9, 2, generator=gen), torch.randn(9, g.hidden, generator=gen)
    compute = TritonExperts(**BLOCKS["dot"], block_i_down=BLOCKS["dot"]["block_i"], split_h=split_h)
    assert compute.tile_scaled(bank.fp8_meta) == tiled
    for blocks in BLOCKS.values():
        compute = TritonExperts(**blocks, block_i_down=blocks["block_i"], split_h=split_h)
        torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(torch.float32))


@pytest.mark.parametrize("split_h", [2, 3, 8])
@pytest.mark.parametrize("hot_fraction", [0.0, 0.5])
def test_triton_grouped_kernels_split_h_sums_every_chunk(triton_interpreted, split_h, hot_fraction):
    """The gate/up reduction over H cut into chunks (partial sums added atomically) computes the
    same function; 8 chunks of 3 H tiles clamp to 3."""
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, reference = _kernel_case(hot_fraction)
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 8, (5, 2), generator=gen)
    ids[1, 0] = -1
    w, x = torch.rand(5, 2, generator=gen), torch.randn(5, g.hidden, generator=gen)
    compute = TritonExperts(block_t=16, block_i=16, block_h=16, block_i_down=16, split_h=split_h)
    assert compute._split(1, g.hidden, x.device) == min(split_h, 3)  # hidden 48 = 3 tiles of 16
    torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(torch.float32))


# mxfp4 is read 32 inputs at a time: tiles along the inputs (block_h, block_i_down) hold whole groups.
MX_BLOCKS = {"small": dict(block_t=4, block_i=8, block_h=32, block_i_down=32),
             "dot": dict(block_t=16, block_i=16, block_h=32, block_i_down=32)}


@pytest.mark.parametrize("blocks, split_h", [("small", 1), ("dot", 1), ("dot", 2)])
def test_triton_grouped_kernels_mxfp4_unpack_tiles_as_they_read_them(triton_interpreted, blocks, split_h):
    """MXFP4 tiles (two e2m1 values a byte, one e8m0 scale per 32 inputs) unpacked by the kernels
    compute the reference on the dequantised weights, hot and cold, on the broadcast and the
    tl.dot paths, with the H reduction whole and cut in 2."""
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, reference = _kernel_case(0.5, stored=MXFP4, hidden=64, inter=64)  # 2 groups of H and of I
    assert bank.precision == "mxfp4" and bank.cold_EB.dtype == torch.uint8
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 8, (9, 2), generator=gen)
    ids[4, 0] = -1
    w, x = torch.rand(9, 2, generator=gen), torch.randn(9, g.hidden, generator=gen)
    compute = TritonExperts(**MX_BLOCKS[blocks], split_h=split_h)
    assert compute.reads_mxfp4(bank) and compute._split(1, g.hidden, x.device) == split_h
    torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(torch.float32))
    with pytest.raises(ValueError, match="block_h and block_i_down must be >= 32, got 16 and 32"):
        TritonExperts(block_h=16, block_i_down=32)(x, ids, w, bank)


def test_triton_kernels_in_the_interpreter_decode_every_e2m1_code_and_e8m0_byte(triton_interpreted):
    """The kernels' bit arithmetic gives every e2m1 code's value (the OCP table, negative codes
    included) and every e8m0 byte's scale: 2^(byte - 127), the subnormal 2^-127 for 0, NaN for 255."""
    from hotsplit_runtime.precision import E2M1_MAGNITUDES, e8m0_scales

    from tests.runtime.mx_decode_kernel import decode_kernel

    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values, scales = torch.empty(256), torch.empty(256)
    decode_kernel[(1,)](byte & 15, byte, values, scales, N=256)
    mags = torch.tensor(E2M1_MAGNITUDES)
    want = torch.cat([mags, -mags])[byte.long() & 15]
    assert torch.equal(values, want) and torch.equal(values.signbit(), want.signbit())
    torch.testing.assert_close(scales, e8m0_scales(byte), rtol=0, atol=0, equal_nan=True)
    assert scales[0].item() == 2.0 ** -127 and scales[255].isnan() and scales[127].item() == 1.0


def test_triton_kernels_in_the_interpreter_read_every_stored_precision_through_swaps(triton_interpreted):
    """choose_compute keeps the kernels whatever the experts are stored in: a model whose layers
    store fp8, mxfp4 and native experts equals the reference on the dequantised weights, step
    after step with swaps between them (a swapped-in expert's stored bytes read from its slot)."""
    from dataclasses import replace

    from hotsplit_runtime.kernels import TritonExperts, choose_compute
    from hotsplit_runtime.model import HotColdMoE
    from hotsplit_runtime.moe import ReferenceMoE
    from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for
    from hotsplit_runtime.precision import layer_formats

    compute = choose_compute(replace(CPU, triton=True))
    assert isinstance(compute, TritonExperts)
    g = geom("sigmoid", hidden=64, inter=32)
    formats = layer_formats(np.array([["fp8"] * 8, ["mxfp4"] * 8, ["native"] * 8]), 3, 8)
    layers = [make_layer_weights(g, li, torch.float32, fmt) for li, fmt in enumerate(formats)]
    rng = np.random.default_rng(3)
    alloc = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
    model = HotColdMoE(layers, g, random_hot(3, 8, 0.5, rng), CPU, alloc, compute)
    ref = ReferenceMoE(layers, CPU.device)
    assert [b.precision for b in model.banks] == ["fp8", "mxfp4", "native"]
    for step in range(3):
        x = torch.randn(5, g.hidden, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))


# The dtypes and stored formats the runtime launches at its default block sizes.
COMPILED_CASES = {"fp32": (torch.float32, None), "fp16": (torch.float16, None), "fp8": (torch.float32, FP8_BLOCKS),
                  "mxfp4-fp32": (torch.float32, MXFP4), "mxfp4-fp16": (torch.float16, MXFP4),
                  "mxfp4-bf16": (torch.bfloat16, MXFP4)}


@pytest.mark.parametrize("case", COMPILED_CASES)
@pytest.mark.parametrize("split_h", [1, 4])
def test_triton_grouped_kernels_at_the_compiled_block_sizes(triton_interpreted, case, split_h):
    """The block sizes the runtime launches by default (t/i/h 16/32/128, down I 64) and the H
    splits test_kernels_compile.py compiles for sm_90, run here in the interpreter: the same
    variants compute the reference's output. (bfloat16 multiplies in float32 here; the tolerance
    is bfloat16's all the same, which also holds on a GPU, where the kernels keep gate and up in
    float32 that the reference rounds to bfloat16.)"""
    from hotsplit_runtime.kernels import TritonExperts

    dtype, stored = COMPILED_CASES[case]
    g, bank, reference = _kernel_case(0.5, dtype, stored=stored, hidden=512, inter=64)  # 4 H tiles of 128
    compute = TritonExperts(split_h=split_h)
    assert (compute.block_t, compute.block_i, compute.block_h, compute.block_i_down) == (16, 32, 128, 64)
    assert compute._split(1, g.hidden, CPU.device) == split_h
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 8, (19, 2), generator=gen)
    ids[3, 1] = -1
    w, x = torch.rand(19, 2, generator=gen), torch.randn(19, g.hidden, generator=gen).to(dtype)
    torch.testing.assert_close(compute(x, ids, w, bank), reference(x, ids, w), **tolerances(dtype))


def test_split_for_fills_the_gpu_only_when_the_launch_is_small():
    from hotsplit_runtime.kernels import split_for

    assert split_for(programs=2176, h_tiles=56, target=528) == 1  # 32 experts at full size: plenty
    assert split_for(programs=72, h_tiles=56, target=528) == 8  # decode, 8 experts x 9 I tiles
    assert split_for(programs=1, h_tiles=3, target=528) == 3  # never more chunks than H tiles


def test_triton_experts_reject_block_sizes_tl_arange_cannot_take():  # raised before triton is imported
    from hotsplit_runtime.kernels import TritonExperts

    with pytest.raises(ValueError, match="block_t"):
        TritonExperts(block_t=12)


def test_triton_grouped_kernels_no_tokens(triton_interpreted):
    from hotsplit_runtime.kernels import TritonExperts

    g, bank, _ = _kernel_case(0.5)
    y = TritonExperts()(torch.zeros(0, g.hidden), torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, 2), bank)
    assert y.shape == (0, g.hidden)


def test_triton_kernel_tests_run_in_a_fresh_interpreter_process():
    """transformers may import triton before this file runs, and the interpreter is chosen at that
    import, so the kernel tests (here, and the checkpoint banks in test_hf_*.py) can skip in a
    full run. Run them once more in a fresh process with TRITON_INTERPRET=1, where they cannot
    skip, so CI always checks the kernels."""
    if interpreter_mode():
        pytest.skip("this process runs the kernel tests in the interpreter itself")
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    files = [str(Path(__file__)), *(str(Path(__file__).with_name(f)) for f in (
        "test_hf_models.py", "test_hf_fp8.py", "test_hf_stored_precision.py", "test_hf_auto_run.py"))]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *files,
         "-k", "(interpreter or grouped_kernels) and not fresh"],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, cwd=root, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary


def test_kernel_compile_tests_run_in_a_fresh_process_without_the_interpreter():
    """Kernels built for the interpreter cannot be compiled for a GPU target, so test_kernels_compile.py
    skips in a process started with TRITON_INTERPRET=1 (or one that built the kernels for it): run it
    once more in its own process without it."""
    if not (STARTED_INTERPRETED or interpreter_mode()):
        pytest.skip("test_kernels_compile.py ran in this process (no interpreter here)")
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    kernels = "tests/runtime/test_kernels_compile.py"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", kernels],
                       env=env, capture_output=True, text=True, cwd=root, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary


def test_a_users_triton_interpret_does_not_reach_the_tests(monkeypatch):
    """A user may export TRITON_INTERPRET=1 for the whole run: each test still sees the environment
    it was written for (the CPU runtime without Triton unless it asks for the interpreter)."""
    assert "TRITON_INTERPRET" not in os.environ  # conftest's autouse fixture
    assert CPU.triton is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cpu_without_triton().triton is False and "TRITON_INTERPRET" in os.environ
