"""Routing of a recipe's synthetic model, for planning what-ifs with `hotsplit balance RECIPE`.

Generated hidden states go through random routers of the recipe's geometry (runtime.moe's
Router: softmax, or DeepSeek-V3 sigmoid with group-limited selection and a score bias). No
expert is computed: only the routing is wanted. Hidden states are a fixed per-layer offset plus
per-token noise, so that, as in trained models, some experts are systematically preferred.

Shape letters: T = tokens of a step, H = hidden (scaled), E = experts, K = top_k, L = MoE layers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hotsplit_cli.config.recipe import Recipe

from ..moe import MoEGeometry, Router


def synthetic_routing(recipe: Recipe, steps: int, batch: int, seed: int = 0,
                      advance: Callable[[int], None] | None = None, keep_trace: bool = False):
    """Counts per step (int64 [S, L, E]) and, with `keep_trace`, expert ids [S, L, T, K] (int32)."""
    geom = MoEGeometry.from_recipe(recipe, recipe.run.scale)
    gen = torch.Generator().manual_seed(seed)
    L, E, H, K = recipe.model.num_moe_layers, geom.num_experts, geom.hidden, geom.top_k
    routers, offsets = [], []
    for _ in range(L):
        w = torch.randn(E, H, generator=gen) / H ** 0.5
        bias = (torch.rand(E, generator=gen) - 0.5) * 0.1 if geom.router == "sigmoid" else None
        routers.append(Router(w, bias, geom))
        offsets.append(torch.randn(H, generator=gen))
    counts = np.zeros((steps, L, E), dtype=np.int64)
    ids_SLTK = np.zeros((steps, L, batch, K), dtype=np.int32) if keep_trace else None
    for s in range(steps):
        x_TH = torch.randn(batch, H, generator=gen)
        for li in range(L):
            ids_TK, _ = routers[li](x_TH + offsets[li])
            counts[s, li] = torch.bincount(ids_TK.reshape(-1), minlength=E).numpy()
            if ids_SLTK is not None:
                ids_SLTK[s, li] = ids_TK.numpy()
        if advance is not None:
            advance(1)
    return counts, ids_SLTK
