"""The routed-expert compute over a bank: hot experts from their slots, cold experts read in
place from the cold bank (zero-copy on a GPU). Two implementations of one computation:

- `TritonExperts`: two kernels, one program per (routed assignment, block of rows). Each
  program looks up `expert2slot` on the device and takes its weight pointer from the hot bank
  or the cold bank, so there is no host synchronisation and a step can be captured in a CUDA
  graph. With TRITON_INTERPRET=1 the same kernels run on a CPU (how the tests check them).
- `TorchExperts`: tokens grouped by expert on the host, each expert's weights taken from its
  slot or the cold bank; the CPU path (and the GPU fallback without Triton).

Both compute, per assignment a = (t, k) of expert e with weight w:
    y[t] += w * w2_e (silu(gate_e x_t) * up_e x_t)
accumulating in float32. Shape letters: T, K, A = T*K assignments, H, I (INTER in the kernels), E, B (blob elements).
"""

from __future__ import annotations

import torch

from .bank import ExpertBank
from .device import DeviceInfo
from .moe import grouped_experts


class TorchExperts:
    name = "torch-grouped"
    capturable = False

    def __call__(self, x_TH, ids_TK, w_TK, bank: ExpertBank, counts_E) -> torch.Tensor:
        slots = bank.expert2slot_E.tolist()  # host read: the CPU path may synchronise
        return grouped_experts(x_TH, ids_TK, w_TK, lambda e: bank.weights_of(e, slots[e]), counts_E)


_KERNELS: dict = {}


def _build_kernels():
    """Compile-on-first-use Triton kernels (imported lazily: triton is optional)."""
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def gate_up_kernel(x_ptr, ids_ptr, e2s_ptr, hot_ptr, cold_ptr, act_ptr, H, INTER, blob_stride,
                       K: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr):
        a = tl.program_id(0)
        pid_i = tl.program_id(1)
        t = a // K
        e = tl.load(ids_ptr + a).to(tl.int64)
        valid = e >= 0
        e_safe = tl.where(valid, e, 0)
        slot = tl.load(e2s_ptr + e_safe).to(tl.int64)
        # The one decision of the hot/cold runtime: read the slot, or the cold bank in place.
        base = tl.where(slot >= 0, hot_ptr + tl.where(slot >= 0, slot, 0) * blob_stride,
                        cold_ptr + e_safe * blob_stride)
        offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
        mask_i = offs_i < INTER  # a padding assignment (-1) reads expert 0; its weight 0 drops it
        acc_g = tl.zeros([BLOCK_I], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_I], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            mask_h = offs_h < H
            xv = tl.load(x_ptr + t * H + offs_h, mask=mask_h, other=0.0).to(tl.float32)
            m2 = mask_i[:, None] & mask_h[None, :]
            wg = tl.load(base + offs_i[:, None] * H + offs_h[None, :], mask=m2, other=0.0).to(tl.float32)
            wu = tl.load(base + (offs_i[:, None] + INTER) * H + offs_h[None, :], mask=m2, other=0.0).to(tl.float32)
            acc_g += tl.sum(wg * xv[None, :], axis=1)
            acc_u += tl.sum(wu * xv[None, :], axis=1)
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(act_ptr + a * INTER + offs_i, act, mask=mask_i)

    @triton.jit
    def down_kernel(act_ptr, ids_ptr, w_ptr, e2s_ptr, hot_ptr, cold_ptr, out_ptr, H, INTER, blob_stride,
                    w2_offset, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr):
        a = tl.program_id(0)
        pid_h = tl.program_id(1)
        e = tl.load(ids_ptr + a).to(tl.int64)
        valid = e >= 0
        e_safe = tl.where(valid, e, 0)
        slot = tl.load(e2s_ptr + e_safe).to(tl.int64)
        base = tl.where(slot >= 0, hot_ptr + tl.where(slot >= 0, slot, 0) * blob_stride,
                        cold_ptr + e_safe * blob_stride) + w2_offset
        offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for i0 in range(0, INTER, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_i = offs_i < INTER
            av = tl.load(act_ptr + a * INTER + offs_i, mask=mask_i, other=0.0)
            wd = tl.load(base + offs_h[:, None] * INTER + offs_i[None, :], mask=mask_h[:, None] & mask_i[None, :],
                         other=0.0).to(tl.float32)
            acc += tl.sum(wd * av[None, :], axis=1)
        wt = tl.load(w_ptr + a)
        wt = tl.where(valid, wt, 0.0)
        tl.store(out_ptr + a * H + offs_h, acc * wt, mask=mask_h)

    _KERNELS.update(gate_up=gate_up_kernel, down=down_kernel, cdiv=triton.cdiv)
    return _KERNELS


class TritonExperts:
    name = "triton"
    capturable = True

    def __init__(self, block_i: int = 32, block_h: int = 128):
        self.block_i, self.block_h = block_i, block_h
        _build_kernels()

    def __call__(self, x_TH, ids_TK, w_TK, bank: ExpertBank, counts_E=None) -> torch.Tensor:
        k = _KERNELS
        T, K = ids_TK.shape
        H, INTER = bank.hidden, bank.inter
        A = T * K
        x = x_TH.contiguous()
        ids = ids_TK.reshape(-1).contiguous()
        wts = w_TK.reshape(-1).float().contiguous()
        act = torch.empty(A, INTER, dtype=torch.float32, device=x.device)
        out = torch.empty(A, H, dtype=torch.float32, device=x.device)
        blob_stride = bank.hot_SB.stride(0)
        k["gate_up"][(A, k["cdiv"](INTER, self.block_i))](
            x, ids, bank.expert2slot_E, bank.hot_SB, bank.cold_read_EB, act, H, INTER, blob_stride,
            K=K, BLOCK_I=self.block_i, BLOCK_H=self.block_h)
        k["down"][(A, k["cdiv"](H, self.block_h))](
            act, ids, wts, bank.expert2slot_E, bank.hot_SB, bank.cold_read_EB, out, H, INTER, blob_stride,
            bank.w2_offset, BLOCK_H=self.block_h, BLOCK_I=self.block_i)
        return out.view(T, K, H).sum(dim=1).to(x_TH.dtype)


def choose_compute(info: DeviceInfo):
    """Triton where it can run on the chosen device, else the torch path (decided once)."""
    return TritonExperts() if info.triton else TorchExperts()
