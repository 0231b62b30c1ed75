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
    at `w_off` and the scales at `s_off` (fp8 and mxfp4 blobs), which of its BLOCK_T rows are
    used, and their assignment indices (t * K + k)."""
    e = tl.load(blk_expert_ptr + pid_n).to(tl.int64)
    start = tl.load(blk_start_ptr + pid_n).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_T)
    mask_t = offs_t < count
    a = tl.load(order_ptr + start + offs_t, mask=mask_t, other=0).to(tl.int64)
    slot = tl.load(e2s_ptr + e).to(tl.int64)
    # The one decision of the hot/cold runtime: read the slot, or the cold bank in place.
    blob = tl.where(slot >= 0, hot_ptr + tl.where(slot >= 0, slot, 0) * blob_stride, cold_ptr + e * blob_stride)
    w_ptr, s_ptr = blob + w_off, blob + s_off  # an mxfp4 blob is bytes throughout: e2m1 pairs, e8m0 scales
    if FP8:  # the blob is bytes: e4m3 weights, and float32 scales from byte s_off
        w_ptr = w_ptr.to(tl.pointer_type(tl.float8e4nv))
        s_ptr = s_ptr.to(tl.pointer_type(tl.float32))
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
def _gate_up_tiles(x_ptr, tok, mask_t, base, s_ptr, offs_i, mask_i, pid_i, pid_s, tiles, H, INTER, s_rows, s_cols,
                   BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, USE_DOT: tl.constexpr,
                   NATIVE: tl.constexpr, FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   TILE_SCALE: tl.constexpr):
    """Gate and up partial sums [BLOCK_T, BLOCK_I] over split pid_s's `tiles` H tiles of a native
    or fp8 w13 (the last split's tiles past H are masked)."""
    acc_g = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    for t in range(0, tiles):
        h0 = (pid_s * tiles + t) * BLOCK_H
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        xv = tl.load(x_ptr + tok[:, None] * H + offs_h[None, :], mask=mask_t[:, None] & mask_h[None, :],
                     other=0.0)
        # Weight tiles [BLOCK_H, BLOCK_I] of w13 [2I, H]: read once for every assignment of the block.
        m2 = mask_h[:, None] & mask_i[None, :]
        wg = tl.load(base + offs_i[None, :] * H + offs_h[:, None], mask=m2, other=0.0)
        wu = tl.load(base + (offs_i[None, :] + INTER) * H + offs_h[:, None], mask=m2, other=0.0)
        if FP8 and TILE_SCALE:  # one scale for the tile: e4m3 is exact in 16 bits, and the scale
            # multiplies the tile's partial sums (one load, no per-element gather or multiply)
            s_at = s_ptr + (pid_i * BLOCK_I // BM) * s_cols + h0 // BN
            sg = tl.load(s_at, mask=h0 < H, other=0.0)  # a spare tile past H has no scale
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
    return acc_g, acc_u


@triton.jit
def _down_tiles(act_ptr, a, mask_t, base, s_ptr, offs_h, mask_h, pid_h, INTER, s_cols, BLOCK_T: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr, USE_DOT: tl.constexpr, NATIVE: tl.constexpr,
                FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BF16: tl.constexpr,
                TILE_SCALE: tl.constexpr):
    """The down projection's sums [BLOCK_T, BLOCK_H] over all of I of a native or fp8 w2."""
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for i0 in range(0, INTER, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mask_i = offs_i < INTER
        av = tl.load(act_ptr + a[:, None] * INTER + offs_i[None, :], mask=mask_t[:, None] & mask_i[None, :],
                     other=0.0)
        # Weight tile [BLOCK_I, BLOCK_H] of w2 [H, I].
        m2 = mask_i[:, None] & mask_h[None, :]
        wd = tl.load(base + offs_h[None, :] * INTER + offs_i[:, None], mask=m2, other=0.0)
        if FP8 and TILE_SCALE:  # one scale for the tile, on its partial sums (as _gate_up_tiles)
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
    return acc


@triton.jit
def gate_up_kernel(x_ptr, order_ptr, blk_expert_ptr, blk_start_ptr, blk_count_ptr, e2s_ptr, hot_ptr, cold_ptr,
                   out_ptr, H, INTER, blob_stride, tiles, s_off, s_rows, s_cols, K: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, USE_DOT: tl.constexpr,
                   NATIVE: tl.constexpr, SPLIT: tl.constexpr, FP8: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, MX: tl.constexpr, TILE_SCALE: tl.constexpr):
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
    if MX:  # w13 in MXFP4 (e8m0 scales [2I, H/32] at byte s_off): the H loop reads 32-input groups
        acc_g, acc_u = _mx_gate_up(x_ptr, tok, mask_t, base, s_ptr, offs_i, mask_i, pid_s, tiles, H, INTER, BLOCK_T,
                                   BLOCK_I, BLOCK_H, USE_DOT, NATIVE)
    else:
        acc_g, acc_u = _gate_up_tiles(x_ptr, tok, mask_t, base, s_ptr, offs_i, mask_i, pid_i, pid_s, tiles, H, INTER,
                                      s_rows, s_cols, BLOCK_T, BLOCK_I, BLOCK_H, USE_DOT, NATIVE, FP8, BM, BN,
                                      TILE_SCALE)
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
                FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BF16: tl.constexpr, MX: tl.constexpr,
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
    if MX:  # w2 in MXFP4 (e8m0 scales [H, I/32] at byte s_off): the I loop reads 32-input groups
        acc = _mx_down(act_ptr, a, mask_t, base, s_ptr, offs_h, mask_h, INTER, BLOCK_T, BLOCK_H, BLOCK_I, USE_DOT,
                       NATIVE, BF16)
    else:
        acc = _down_tiles(act_ptr, a, mask_t, base, s_ptr, offs_h, mask_h, pid_h, INTER, s_cols, BLOCK_T, BLOCK_H,
                          BLOCK_I, USE_DOT, NATIVE, FP8, BM, BN, BF16, TILE_SCALE)
    wt = tl.load(w_ptr + a, mask=mask_t, other=0.0)
    tl.store(out_ptr + a[:, None] * H + offs_h[None, :], acc * wt[:, None], mask=mask_t[:, None] & mask_h[None, :])


# ---- MXFP4 weights (OCP MX v1.0; runtime/precision.py): a matrix [rows, n_in] is stored as bytes
# [rows, n_in / 2], two e2m1 codes a byte (input 2b in the low nibble of byte b, 2b + 1 in the
# high one), and e8m0 scale bytes [rows, n_in / 32], one per row and 32-input group. The kernels
# read a tile as its groups: per group the codes [16 bytes, rows] multiply the group's even and
# odd inputs, exactly in the activations' dtype (an e2m1 value has 2 significant bits), and the
# group's scale, a power of two per row, multiplies the partial sums, so no scale is gathered or
# multiplied per weight. Each weight byte and each scale byte is read once.


@triton.jit
def _e2m1(code):
    """float32 values of e2m1 codes (int32 0..15: sign, 2 exponent bits, 1 mantissa bit), built
    as float32 bits: exponent e > 0 is 2^(e - 1) x (1 + m / 2), e = 0 is m / 2."""
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0x3F000000: 0.5
    v = bits.to(tl.float32, bitcast=True)
    return tl.where(code >= 8, -v, v)


@triton.jit
def _e8m0(s):
    """float32 2^(s - 127) of e8m0 scale bytes (int32): the byte is a float32's exponent field;
    byte 0 is the subnormal 2^-127, 255 is NaN."""
    bits = tl.where(s == 0, 0x00400000, s << 23)
    bits = tl.where(s == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mx_inputs(x_ptr, rows, mask_rows, grp, n_in):
    """The even and the odd inputs [R, 16] of 32-input group `grp` of rows `rows` of x [.., n_in]
    (zero past n_in)."""
    offs = grp * 32 + 2 * tl.arange(0, 16)
    m = mask_rows[:, None] & (offs < n_in)[None, :]
    p = x_ptr + rows[:, None] * n_in + offs[None, :]
    return tl.load(p, mask=m, other=0.0), tl.load(p + 1, mask=m, other=0.0)


@triton.jit
def _mx_group_dot(x_even, x_odd, w_ptr, s_ptr, rows, mask_rows, grp, n_in, USE_DOT: tl.constexpr,
                  NATIVE: tl.constexpr):
    """x [T, 32] (its even and odd inputs [T, 16]) times the 32-input group `grp` of rows `rows`
    [R] of an MXFP4 matrix of n_in inputs: float32 [T, R]. A group past n_in adds 0."""
    offs_b = grp * 16 + tl.arange(0, 16)  # the group's 16 bytes in each row
    m = (offs_b < n_in // 2)[:, None] & mask_rows[None, :]
    b = tl.load(w_ptr + rows[None, :] * (n_in // 2) + offs_b[:, None], mask=m, other=0).to(tl.int32)  # [16, R]
    # (a where, not `mask_rows & (grp < ..)`: the interpreter gives that mask int32 when grp is a loop scalar)
    s = tl.load(s_ptr + rows * (n_in // 32) + grp, mask=tl.where(grp < n_in // 32, mask_rows, False), other=127)
    even, odd = _e2m1(b & 15), _e2m1(b >> 4)
    if NATIVE:  # 16-bit operands for the tensor cores: e2m1 values are exact in them
        even, odd = even.to(x_even.dtype), odd.to(x_even.dtype)
    acc = _matmul(x_even, even, USE_DOT, NATIVE) + _matmul(x_odd, odd, USE_DOT, NATIVE)
    return acc * _e8m0(s.to(tl.int32))[None, :]


@triton.jit
def _mx_gate_up(x_ptr, tok, mask_t, w_ptr, s_ptr, offs_i, mask_i, pid_s, tiles, H, INTER, BLOCK_T: tl.constexpr,
                BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, USE_DOT: tl.constexpr, NATIVE: tl.constexpr):
    """Gate and up [BLOCK_T, BLOCK_I] of gate_up_kernel's program over MXFP4 w13 ([2I, H/2] bytes
    at w_ptr, scales [2I, H/32] at s_ptr): the same H tiles and splits, each read as its
    BLOCK_H / 32 groups."""
    acc_g = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.float32)
    for t in range(0, tiles):
        for j in tl.static_range(BLOCK_H // 32):
            grp = (pid_s * tiles + t) * (BLOCK_H // 32) + j  # past H in the last split's spare tiles: adds 0
            x_even, x_odd = _mx_inputs(x_ptr, tok, mask_t, grp, H)
            acc_g += _mx_group_dot(x_even, x_odd, w_ptr, s_ptr, offs_i, mask_i, grp, H, USE_DOT, NATIVE)
            acc_u += _mx_group_dot(x_even, x_odd, w_ptr, s_ptr, offs_i + INTER, mask_i, grp, H, USE_DOT, NATIVE)
    return acc_g, acc_u


@triton.jit
def _mx_down(act_ptr, a, mask_t, w_ptr, s_ptr, offs_h, mask_h, INTER, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
             BLOCK_I: tl.constexpr, USE_DOT: tl.constexpr, NATIVE: tl.constexpr, BF16: tl.constexpr):
    """The down projection [BLOCK_T, BLOCK_H] of down_kernel's program over MXFP4 w2 ([H, I/2]
    bytes at w_ptr, scales [H, I/32] at s_ptr), each I tile read as its BLOCK_I / 32 groups."""
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for i0 in range(0, INTER, BLOCK_I):
        for j in tl.static_range(BLOCK_I // 32):
            a_even, a_odd = _mx_inputs(act_ptr, a, mask_t, i0 // 32 + j, INTER)
            if NATIVE:  # the activation rounded to 16 bits before the down projection, as the reference rounds it
                wdt = tl.bfloat16 if BF16 else tl.float16
                a_even, a_odd = a_even.to(wdt), a_odd.to(wdt)
            acc += _mx_group_dot(a_even, a_odd, w_ptr, s_ptr, offs_h, mask_h, i0 // 32 + j, INTER, USE_DOT, NATIVE)
    return acc
