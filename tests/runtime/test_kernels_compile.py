"""The Triton kernels compile for a real GPU target (sm_90, Hopper) on any machine: the
interpreter runs them on a CPU (test_runtime_bank.py) but is lenient about types and shapes that
the compiler refuses, so every variant the runtime launches is compiled here too."""

from __future__ import annotations

import os
import re

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("interpreted kernels cannot be compiled; test_runtime_bank.py::test_kernel_compile_tests_run_in_a_"
                "fresh_process_without_the_interpreter runs this file again in its own process",
                allow_module_level=True)

from hotsplit_runtime import triton_kernels as tk  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
WEIGHT = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def _compile(fn, types: dict, consts: dict):
    if tk.INTERPRET:
        pytest.skip("the kernels were built for the interpreter in this process; test_runtime_bank.py::test_kernel_"
                    "compile_tests_run_in_a_fresh_process_without_the_interpreter runs this file again in its own "
                    "process")
    sig = {n: types.get(n, "constexpr") for n in fn.arg_names}
    return triton.compile(ASTSource(fn, sig, consts), target=HOPPER)


MMA = {"bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
       "fp16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}


# An e8m0 scale byte shifted into a float32's exponent field: how the kernels scale mxfp4 groups.
E8M0_TO_FLOAT = re.compile(r"shl\.b32\s+%r\d+, %r\d+, 23;")


def _check_ptx(kernel, name: str, w: str, dot: bool, fp8: bool, atomic: bool | None = None, mx: bool = False) -> None:
    """The compiled kernel is the variant asked for, read from its PTX: an sm_90 entry of that
    name with a cubin; tensor-core multiplies in the weights' 16-bit dtype exactly when the variant
    takes the native tl.dot path (none for float32 weights, which multiply exactly, nor for the
    broadcast path of small blocks); fp8 tiles converted from e4m3 as they are read, mxfp4 scales
    made from their e8m0 bytes; and, for the
    gate/up kernel, the partial sums of an H split added atomically (a whole reduction stores).
    What the kernels compute is checked against the torch reference by the interpreter tests of
    test_runtime_bank.py, at these same block sizes."""
    ptx = kernel.asm["ptx"]
    assert ".target sm_90" in ptx and f".entry {name}(" in ptx and len(kernel.asm["cubin"]) > 0
    mma = [op for op in MMA.values() if op in ptx]
    assert mma == ([MMA[w]] if dot and w in MMA else []), mma
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) == fp8
    assert bool(E8M0_TO_FLOAT.search(ptx)) == mx
    if atomic is not None:
        assert ("atom.global.gpu.acq_rel.add.f32" in ptx) == atomic


def _common(w: str, fp8: bool) -> dict:
    blob = "*u8" if fp8 else WEIGHT[w]  # an fp8 blob is bytes: e4m3 weights, then float32 scales
    return {"order_ptr": "*i64", "blk_expert_ptr": "*i32", "blk_start_ptr": "*i64", "blk_count_ptr": "*i32",
            "e2s_ptr": "*i32", "hot_ptr": blob, "cold_ptr": blob, "H": "i32", "INTER": "i32",
            "blob_stride": "i32", "tiles": "i32", "s_off": "i32", "s_rows": "i32", "s_cols": "i32"}


# (weights, native 16-bit dot, blocks t/i/h): what TritonExperts launches for each dtype.
VARIANTS = [("bf16", True, (16, 32, 128)), ("fp16", True, (16, 32, 128)), ("fp32", False, (16, 32, 128)),
            ("bf16", True, (4, 8, 16))]


# fp8 weights: a scale per element (blocks that cut tiles) or one per tile (128x128 blocks).
FP8_VARIANTS = [(False, False), (True, False), (True, True)]
FP8_IDS = ["weights", "fp8-weights", "fp8-tile-scaled"]


@pytest.mark.parametrize("fp8, tiled", FP8_VARIANTS, ids=FP8_IDS)
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("w, native, blocks", VARIANTS)
def test_gate_up_kernel_compiles_for_hopper(w, native, blocks, split, fp8, tiled):
    bt, bi, bh = blocks
    types = {**_common(w, fp8), "x_ptr": WEIGHT[w], "out_ptr": "*fp32"}
    dot = min(blocks) >= 16
    kernel = _compile(tk.gate_up_kernel, types, dict(K=8, BLOCK_T=bt, BLOCK_I=bi, BLOCK_H=bh, USE_DOT=dot,
                                                     NATIVE=native, SPLIT=split, FP8=fp8, BM=128, BN=128,
                                                     TILE_SCALE=tiled, MX=False))
    _check_ptx(kernel, "gate_up_kernel", w, dot and native, fp8, atomic=split > 1)


@pytest.mark.parametrize("fp8, tiled", FP8_VARIANTS, ids=FP8_IDS)
@pytest.mark.parametrize("w, native, blocks", VARIANTS)
def test_down_kernel_compiles_for_hopper(w, native, blocks, fp8, tiled):
    bt, _, bh = blocks
    bi = 64 if min(blocks) >= 16 else 8
    types = {**_common(w, fp8), "act_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "w2_offset": "i32"}
    del types["s_rows"], types["tiles"]
    dot = min(bt, bi, bh) >= 16
    kernel = _compile(tk.down_kernel, types, dict(BLOCK_T=bt, BLOCK_H=bh, BLOCK_I=bi, USE_DOT=dot,
                                                  NATIVE=native, FP8=fp8, BM=128, BN=128, BF16=w == "bf16",
                                                  TILE_SCALE=tiled, MX=False))
    _check_ptx(kernel, "down_kernel", w, dot and native, fp8)


# mxfp4 weights are read 32 inputs at a time (runtime/triton_kernels.py): tiles along the inputs
# (BLOCK_H for gate/up, BLOCK_I for down) hold whole groups, so the small variant reads 32 of them.
MX_VARIANTS = [*VARIANTS[:3], ("bf16", True, (4, 8, 32))]


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("w, native, blocks", MX_VARIANTS)
def test_mxfp4_gate_up_kernel_compiles_for_hopper(w, native, blocks, split):
    bt, bi, bh = blocks
    types = {**_common(w, fp8=True), "x_ptr": WEIGHT[w], "out_ptr": "*fp32"}  # an mxfp4 blob is bytes too
    dot = min(bt, bi) >= 16  # each dot reduces over one group's 16 input pairs
    kernel = _compile(tk.gate_up_kernel, types, dict(K=8, BLOCK_T=bt, BLOCK_I=bi, BLOCK_H=bh, USE_DOT=dot,
                                                     NATIVE=native, SPLIT=split, FP8=False, BM=1, BN=1, MX=True,
                                                     TILE_SCALE=False))
    _check_ptx(kernel, "gate_up_kernel", w, dot and native, False, atomic=split > 1, mx=True)


@pytest.mark.parametrize("w, native, blocks", MX_VARIANTS)
def test_mxfp4_down_kernel_compiles_for_hopper(w, native, blocks):
    bt, _, bh = blocks
    bi = 64 if min(blocks) >= 16 else 32
    types = {**_common(w, fp8=True), "act_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "w2_offset": "i32"}
    del types["s_rows"], types["tiles"]
    dot = min(bt, bh) >= 16
    kernel = _compile(tk.down_kernel, types, dict(BLOCK_T=bt, BLOCK_H=bh, BLOCK_I=bi, USE_DOT=dot, NATIVE=native,
                                                  FP8=False, BM=1, BN=1, BF16=w == "bf16", MX=True,
                                                  TILE_SCALE=False))
    _check_ptx(kernel, "down_kernel", w, dot and native, False, mx=True)
