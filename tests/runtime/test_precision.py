"""Stored precisions (runtime/precision.py): the MXFP4 codec against the OCP rules and against
transformers' own dequantisation of gpt-oss weights, the bytes a bank stores against the planner's
figures, and the hot/cold model at each precision against a reference on the dequantised weights."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hotsplit_runtime.fp8 import RELEASE_FP8
from hotsplit_runtime.moe import MoEGeometry
from hotsplit_runtime.precision import (
    MXFP4,
    Mxfp4Experts,
    check_precision_dims,
    e8m0_scales,
    mxfp4_dequantize,
    mxfp4_quantize,
    stored_format,
    uniform_layer_precisions,
)
from hotsplit_runtime.selftest import build_pair, random_hot, random_moves, tolerances

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from tests.conftest import cpu_without_triton

CPU = cpu_without_triton()


def _weights(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_mxfp4_round_trip_is_within_half_a_step_of_e2m1():
    w = _weights(24, 96)
    blocks, scales = mxfp4_quantize(w)
    assert blocks.shape == (24, 3, 16) and blocks.dtype == torch.uint8 and scales.shape == (24, 3)
    back = mxfp4_dequantize(blocks, scales, torch.float32)
    scale = e8m0_scales(scales).repeat_interleave(32, dim=1)
    # e2m1 steps are 0.5 below 2, 1 to 4, 2 to 6 (in units of the scale): half a step is at most
    # a fifth of the value from 1 up, and a quarter of the scale below it.
    assert ((back - w).abs() <= torch.maximum(w.abs() / 5, scale / 4)).all()
    assert ((w.abs().view(24, 3, 32).amax(-1) / e8m0_scales(scales)) <= 6).all()  # no value clipped
    assert torch.equal(mxfp4_dequantize(*mxfp4_quantize(back), torch.float32), back)  # grid values are fixed points


def test_mxfp4_rounds_to_nearest_with_ties_to_even_codes():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 6.0] + [0.0] * 23)  # amax 6: scale 1
    blocks, scales = mxfp4_quantize(ties[None])
    assert scales.item() == 127
    got = mxfp4_dequantize(blocks, scales, torch.float32)[0, :9].tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0]


@pytest.mark.parametrize(("amax", "byte"), [(6.0, 127), (6.0 * 2 ** 5, 132), (6.0001, 128), (3.0, 126),
                                             (0.0, 0), (1e-45, 0), (3e38, 253)])
def test_e8m0_scales_are_the_smallest_power_of_two_that_holds_the_group(amax, byte):
    group = torch.zeros(1, 32)
    group[0, 7] = amax
    blocks, scales = mxfp4_quantize(group)
    assert scales.item() == byte
    back = mxfp4_dequantize(blocks, scales, torch.float32)
    assert back[0, 7].item() <= max(amax, 0.0) * (1 + 1e-6) and (back[0, :7] == 0).all()


def test_e8m0_edge_bytes_decode_as_the_spec_says():
    s = e8m0_scales(torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8))
    assert s[:4].tolist() == [2.0 ** -127, 2.0 ** -126, 1.0, 2.0 ** 127] and torch.isnan(s[4])
    every_byte = torch.arange(256, dtype=torch.uint8).repeat(2, 1).view(2, 16, 16)  # every code pair, every scale
    scales = torch.tensor([[0, 254] * 8, [1, 127] * 8], dtype=torch.uint8)
    f32 = mxfp4_dequantize(every_byte, scales, torch.float32)
    for dtype in (torch.bfloat16, torch.float16):  # bf16 multiplies in bf16, fp16 in float32: both round f32's
        assert torch.equal(mxfp4_dequantize(every_byte, scales, dtype), f32.to(dtype))


def test_mxfp4_refuses_inputs_not_a_multiple_of_32_and_non_finite_weights():
    with pytest.raises(ValueError, match="multiple of 32, got 48"):
        mxfp4_quantize(torch.ones(2, 48))
    with pytest.raises(ValueError, match="finite"):
        mxfp4_quantize(torch.full((2, 32), float("inf")))
    with pytest.raises(UsageError, match=r"^recipe x: precision mxfp4 needs expert input dims divisible by 32, "
                                         r"got hidden 64 and moe_intermediate 24") as e:
        check_precision_dims("mxfp4", 64, 24, "recipe x")
    assert "\n" not in str(e.value)
    check_precision_dims("fp8", 64, 24, "recipe x")  # fp8 blocks may be partial


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp4_dequantisation_equals_transformers_bit_for_bit(dtype):
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    w13, w2 = _weights(3, 64, 96, seed=1), _weights(3, 96, 32, seed=2) * 40
    q = Mxfp4Experts.quantize(w13, w2)
    mine13, mine2 = q.dequantized(dtype)
    # transformers returns gpt-oss's [E, in, out] (its experts compute x @ W)
    theirs13 = mxfp4.convert_moe_packed_tensors(q.b13_EIGB, q.s13_EIG, dtype=dtype)
    theirs2 = mxfp4.convert_moe_packed_tensors(q.b2_EHGB, q.s2_EHG, dtype=dtype)
    assert torch.equal(mine13, theirs13.transpose(1, 2)) and torch.equal(mine2, theirs2.transpose(1, 2))
    lut = torch.tensor(mxfp4.FP4_VALUES)
    assert torch.equal(lut[(q.b13_EIGB & 0xF).long()], mxfp4_dequantize(q.b13_EIGB, torch.full_like(q.s13_EIG, 127),
                                                                        torch.float32).view(3, 64, 3, 16, 2)[..., 0])


@pytest.mark.parametrize("precision", ["native", "fp8", "mxfp4"])
def test_a_bank_stores_the_bytes_the_planner_charges(precision):
    hidden, inter = 256, 128
    g = MoEGeometry(hidden=hidden, inter=inter, num_experts=4, top_k=2, shared_inter=0, router="softmax")
    model, _ = build_pair(g, 1, np.zeros((1, 4), dtype=bool), CPU, torch.bfloat16, stored=stored_format(precision))
    bank = model.banks[0]
    dtype = {"native": "bf16"}.get(precision, precision)
    recipe = SimpleNamespace(model=SimpleNamespace(hidden_size=hidden, moe_intermediate_size=inter, expert_dtype=dtype,
                                                   expert_bias=False), parallel=SimpleNamespace(tp=1))
    assert bank.precision == precision and bank.blob_layout.stored_bytes == expert_bytes_per_rank(recipe)
    assert 0 <= bank.expert_bytes - bank.blob_layout.stored_bytes < 16 * 4  # parts aligned to 16 bytes


@pytest.mark.parametrize("fmt", [RELEASE_FP8, MXFP4], ids=["fp8", "mxfp4"])
def test_stored_experts_equal_the_reference_on_their_dequantised_values_across_swaps(fmt):
    rng = np.random.default_rng(3)
    g = MoEGeometry(hidden=64, inter=32, num_experts=8, top_k=2, shared_inter=32, router="softmax")
    model, ref = build_pair(g, 2, random_hot(2, 8, 0.5, rng), CPU, torch.float32, stored=fmt)
    stored = [b.cold_EB.clone() for b in model.banks]
    for step in range(4):
        x = torch.randn(6, g.hidden, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))
        model.publish_ready(wait=True)
    for bank, cold in zip(model.banks, stored, strict=True):  # a hot copy is the cold expert's stored bytes
        assert torch.equal(bank.cold_EB, cold)
        for slot, e in enumerate(bank.table.slot2expert_S.tolist()):
            assert torch.equal(bank.hot_SB[slot], cold[e])


def test_per_expert_precisions_give_one_precision_per_layer():
    assert uniform_layer_precisions(np.array([["fp8"] * 3, ["mxfp4"] * 3]), 2, 3) == ["fp8", "mxfp4"]
    with pytest.raises(UsageError, match=r"^layer 1 mixes precisions fp8, native"):
        uniform_layer_precisions([["fp8"] * 3, ["fp8", "native", "fp8"]], 2, 3)
    with pytest.raises(UsageError, match=r"^layer 0: precision 'int4' is not one of native, fp8, mxfp4"):
        uniform_layer_precisions([["int4"] * 3], 1, 3)
    with pytest.raises(UsageError, match=r"shape 1 x 3, want 2 x 3"):
        uniform_layer_precisions([["fp8"] * 3], 2, 3)


def test_layers_of_one_model_may_store_different_precisions():
    """The runtime takes a per-(layer, expert) precision array: one bank per layer, so one
    precision per layer, each layer's experts stored, swapped and computed at its own."""
    from hotsplit_runtime.kernels import choose_compute
    from hotsplit_runtime.model import HotColdMoE
    from hotsplit_runtime.moe import ReferenceMoE, make_layer_weights
    from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for
    from hotsplit_runtime.precision import layer_formats

    g = MoEGeometry(hidden=64, inter=32, num_experts=8, top_k=2, shared_inter=0, router="softmax")
    precision_LE = np.array([["fp8"] * 8, ["mxfp4"] * 8, ["native"] * 8])
    formats = layer_formats(precision_LE, 3, 8)
    layers = [make_layer_weights(g, li, torch.float32, fmt) for li, fmt in enumerate(formats)]
    rng = np.random.default_rng(0)
    alloc = PinnedAllocator(pin=False, numa=numa_policy_for("off", None))
    model = HotColdMoE(layers, g, random_hot(3, 8, 0.5, rng), CPU, alloc, choose_compute(CPU))
    ref = ReferenceMoE(layers, CPU.device)
    assert [b.precision for b in model.banks] == ["fp8", "mxfp4", "native"]
    for step in range(3):
        x = torch.randn(5, 64, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
        model.begin_swaps(random_moves(model, 2, rng))
        model.publish_ready(wait=True)


def test_mxfp4_banks_refuse_the_cpu_path_in_one_line():
    """Dequantising mxfp4 on the CPU streams ~60x fewer bytes/s than native (docs/benchmarks.md):
    as with fp8, cold_path cpu and split are refused, gpu is not."""
    from hotsplit_runtime import cold_split

    g = MoEGeometry(hidden=64, inter=32, num_experts=4, top_k=2, shared_inter=0, router="softmax")
    model, _ = build_pair(g, 1, np.zeros((1, 4), dtype=bool), CPU, torch.float32, stored=MXFP4)
    for mode in ("cpu", "split"):
        with pytest.raises(UsageError, match=rf"^cold_path {mode}: the CPU cannot compute mxfp4 experts") as e:
            cold_split.make_split(mode, CPU, model.banks[0])
        assert "\n" not in str(e.value)
    assert cold_split.make_split("gpu", CPU, model.banks[0]) is None
