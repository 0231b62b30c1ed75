"""A test oracle for the grouped expert compute: every expert on every token."""

from __future__ import annotations

import torch
from hotsplit_runtime.moe import swiglu


def dense_reference(x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor, w13_EIH: torch.Tensor,
                    w2_EHI: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, combined by a dense [T, E] weight matrix: slow, independent of
    any grouping or slot logic, for tests."""
    T, _ = x_TH.shape
    E = w13_EIH.shape[0]
    comb_TE = torch.zeros(T, E, dtype=torch.float32, device=x_TH.device)
    valid = ids_TK >= 0
    comb_TE.scatter_add_(1, ids_TK.clamp(min=0), torch.where(valid, w_TK.float(), 0.0))
    out_TH = torch.zeros(T, x_TH.shape[1], dtype=torch.float32, device=x_TH.device)
    for e in range(E):
        out_TH += swiglu(x_TH, w13_EIH[e], w2_EHI[e]).float() * comb_TE[:, e:e + 1]
    return out_TH.to(x_TH.dtype)
