"""The Triton kernels of `TritonExperts` (runtime/kernels.py), as top-level jit functions so that
Triton resolves the helpers the kernels call among this module's globals.

Imported only where Triton runs (runtime/kernels.py imports it on first use): triton.jit reads
TRITON_INTERPRET when it is applied, so the mode this module is imported in (a GPU, or the
interpreter on a CPU) is the mode of its kernels for the whole process (`INTERPRET`).
"""

from __future__ import annotations

import os

# Triton 3.9 warns that its default (fused multiply-add on) will change; keep it explicitly.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = bool(triton.knobs.runtime.interpret)  # the kernels run in the interpreter (TRITON_INTERPRET=1)


@triton.jit
def _block(pid_n, count, order_ptr, blk_expert_ptr, blk_start_ptr, e2s_ptr, hot_ptr, cold_ptr, blob_stride, w_off,
           s_off, BLOCK_T: tl.constexpr, FP8: tl.constexpr):
    """Block pid_n of the grouped launch: in its expert's blob (hot slot or cold bank) the weights
    at `w_off` and the scales (FP8 only), which of its BLOCK_T rows are used, and their assignment
    indices (t * K + k)."""
    e = tl.load(blk_expert_ptr + pid_n).to(tl.int64)
    start = tl.load(blk_start_ptr + pid_n).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_T)
    mask_t = offs_t < count
    a = tl.load(order_ptr + start + offs_t, mask=mask_t, other=0).to(tl.int64)
    slot = tl.load(e2s_ptr + e).to(tl.int64)
    # The one decision of the hot/cold runtime: read the slot, or the cold bank in place.
    blob = tl.where(slot >= 0, hot_ptr + tl.where(slot >= 0, slot, 0) * blob_stride, cold_ptr + e * blob_stride)
    w_ptr, s_ptr = blob + w_off, blob
    if FP8:  # the blob is bytes: e4m3 weights, and float32 scales from byte s_off
        w_ptr = w_ptr.to(tl.pointer_type(tl.float8e4nv))
        s_ptr = (blob + s_off).to(tl.pointer_type(tl.float32))
    return w_ptr, s_ptr, mask_t, a


@triton.jit
def _matmul(a, b, USE_DOT: tl.constexpr, NATIVE: tl.constexpr):
    """[M, R] x [R, N] -> float32 [M, N]. tl.dot needs every block >= 16; below that a
    broadcast multiply and sum. NATIVE: 16-bit operands (tensor cores), else float32 exactly."""
    if USE_DOT:
        if NATIVE:
            acc = tl.dot(a.to(b.dtype), b, out_dtype=tl.float32)
        else:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee", out_dtype=tl.float32)
    else:
        acc = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return acc


@triton.jit
def _block_scale(s_ptr, rows, cols, s_cols, mask, BM: tl.constexpr, BN: tl.constexpr):
    """The fp8 block scale of each element (rows, cols broadcast to a tile): scale
    [rows // BM, cols // BN] of a grid s_cols wide, float32."""
    return tl.load(s_ptr + (rows // BM) * s_cols + cols // BN, mask=mask, other=0.0)


@triton.jit
def gate_up_kernel(x_ptr, order_ptr, blk_expert_ptr, blk_start_ptr, blk_count_ptr, e2s_ptr, hot_ptr, cold_ptr,
                   out_ptr, H, INTER, blob_stride, tiles, s_off, s_rows, s_cols, K: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, USE_DOT: tl.constexpr,
                   NATIVE: tl.constexpr, SPLIT: tl.constexpr, FP8: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, TILE_SCALE: tl.constexpr):
    """SPLIT == 1: act [A, I] = silu(gate) * up. SPLIT > 1: program (n, i, s) sums the s-th
    chunk of H and adds its partial gate and up into out [A, 2I] (float32, zeroed).
    FP8: the blob is bytes, w13 is e4m3 and its block scales (float32 [2, s_rows, s_cols]:
    gate, then up) start at byte s_off; each weight tile is dequantised as it is read, or, with
    TILE_SCALE (every tile inside one scale block), scaled once on its partial sums."""
    pid_n = tl.program_id(0)
    pid_i = tl.program_id(1)
    pid_s = tl.program_id(2)
    count = tl.load(blk_count_ptr + pid_n)
    if count == 0:  # a block past the last used one (the grid is sized for the worst case)
        return
    base, s_ptr, mask_t, a = _block(pid_n, count, order_ptr, blk_expert_ptr, blk_start_ptr, e2s_ptr, hot_ptr,
                                    cold_ptr, blob_stride, 0, s_off, BLOCK_T, FP8)
    tok = a // K
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < INTER
    acc_g = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    # `tiles` H tiles per split, ceil(ceil(H / BLOCK_H) / SPLIT), from the host (shapes only);
    # the last split's tiles past H are masked.
    for t in range(0, tiles):
        offs_h = (pid_s * tiles + t) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        xv = tl.load(x_ptr + tok[:, None] * H + offs_h[None, :], mask=mask_t[:, None] & mask_h[None, :],
                     other=0.0)
        # Weight tiles [BLOCK_H, BLOCK_I] of w13 [2I, H]: read once for every assignment of the block.
        m2 = mask_h[:, None] & mask_i[None, :]
        wg = tl.load(base + offs_i[None, :] * H + offs_h[:, None], mask=m2, other=0.0)
        wu = tl.load(base + (offs_i[None, :] + INTER) * H + offs_h[:, None], mask=m2, other=0.0)
        if FP8 and TILE_SCALE:  # one scale for the whole tile: e4m3 is exact in 16 bits, the scale
            # multiplies the tile's partial sums (one load, no per-element gather or multiply)
            h0 = (pid_s * tiles + t) * BLOCK_H  # past H in the last split's spare tiles: no scale
            s_at = s_ptr + (pid_i * BLOCK_I // BM) * s_cols + h0 // BN
            sg = tl.load(s_at, mask=h0 < H, other=0.0)
            su = tl.load(s_at + s_rows * s_cols, mask=h0 < H, other=0.0)
            wdt = xv.dtype if NATIVE else tl.float32
            acc_g += _matmul(xv, wg.to(wdt), USE_DOT, NATIVE) * sg
            acc_u += _matmul(xv, wu.to(wdt), USE_DOT, NATIVE) * su
        else:
            if FP8:  # value x block scale, in the activations' dtype for 16-bit dots, else float32
                sg = _block_scale(s_ptr, offs_i[None, :], offs_h[:, None], s_cols, m2, BM, BN)
                su = _block_scale(s_ptr + s_rows * s_cols, offs_i[None, :], offs_h[:, None], s_cols, m2, BM, BN)
                wg = wg.to(tl.float32) * sg
                wu = wu.to(tl.float32) * su
                if NATIVE:
                    wg = wg.to(xv.dtype)
                    wu = wu.to(xv.dtype)
            acc_g += _matmul(xv, wg, USE_DOT, NATIVE)
            acc_u += _matmul(xv, wu, USE_DOT, NATIVE)
    m_out = mask_t[:, None] & mask_i[None, :]
    if SPLIT == 1:
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(out_ptr + a[:, None] * INTER + offs_i[None, :], act, mask=m_out)
    else:
        row = out_ptr + a[:, None] * (2 * INTER) + offs_i[None, :]
        tl.atomic_add(row, acc_g, mask=m_out)
        tl.atomic_add(row + INTER, acc_u, mask=m_out)


@triton.jit
def down_kernel(act_ptr, order_ptr, w_ptr, blk_expert_ptr, blk_start_ptr, blk_count_ptr, e2s_ptr, hot_ptr,
                cold_ptr, out_ptr, H, INTER, blob_stride, w2_offset, s_off, s_cols, BLOCK_T: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr, USE_DOT: tl.constexpr, NATIVE: tl.constexpr,
                FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BF16: tl.constexpr,
                TILE_SCALE: tl.constexpr):
    """FP8: w2 is e4m3 with float32 block scales [.., s_cols] at byte s_off of the blob,
    dequantised to bfloat16 (BF16) or float16 when NATIVE."""
    pid_n = tl.program_id(0)
    pid_h = tl.program_id(1)
    count = tl.load(blk_count_ptr + pid_n)
    if count == 0:
        return
    base, s_ptr, mask_t, a = _block(pid_n, count, order_ptr, blk_expert_ptr, blk_start_ptr, e2s_ptr, hot_ptr,
                                    cold_ptr, blob_stride, w2_offset, s_off, BLOCK_T, FP8)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for i0 in range(0, INTER, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mask_i = offs_i < INTER
        av = tl.load(act_ptr + a[:, None] * INTER + offs_i[None, :], mask=mask_t[:, None] & mask_i[None, :],
                     other=0.0)
        # Weight tile [BLOCK_I, BLOCK_H] of w2 [H, I].
        m2 = mask_i[:, None] & mask_h[None, :]
        wd = tl.load(base + offs_h[None, :] * INTER + offs_i[:, None], mask=m2, other=0.0)
        if FP8 and TILE_SCALE:  # one scale for the tile, on its partial sums (as gate_up_kernel)
            sd = tl.load(s_ptr + (pid_h * BLOCK_H // BM) * s_cols + i0 // BN)
            wdt = (tl.bfloat16 if BF16 else tl.float16) if NATIVE else tl.float32
            acc += _matmul(av, wd.to(wdt), USE_DOT, NATIVE) * sd
        else:
            if FP8:
                sd = _block_scale(s_ptr, offs_h[None, :], offs_i[:, None], s_cols, m2, BM, BN)
                wd = wd.to(tl.float32) * sd
                if NATIVE:  # 16-bit weights for the tensor cores, as the activations' dtype
                    wd = wd.to(tl.bfloat16 if BF16 else tl.float16)
            acc += _matmul(av, wd, USE_DOT, NATIVE)
    wt = tl.load(w_ptr + a, mask=mask_t, other=0.0)
    tl.store(out_ptr + a[:, None] * H + offs_h[None, :], acc * wt[:, None], mask=mask_t[:, None] & mask_h[None, :])
