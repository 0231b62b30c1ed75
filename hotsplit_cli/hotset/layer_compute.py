"""A decode layer's compute time at each batch, as the probe's GPU compute rate prices it: the time
a staged copy can hide behind (hotset/prefetch_plan.py).

A layer computes through the weights it keeps on the GPU: its share of the non-expert weights
(attention, norms, shared and dense MLPs: the recipe's dense weights over its layers) with every
token of the step, and each hot routed expert the step touches with that expert's tokens (the
step's routed assignments over the experts it touches). Each runs at the platform's measured
rate through resident weights (probes/gpu_compute.py) at its token count. Cold experts are not
counted: they are read over the link, which the step model times apart. Neither are kernel
launches nor attention over the KV cache, so the figure is a floor: the planner never counts on
more room to hide copies than the weights give.
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.config.platform_file import GpuInfo, PlatformInfo
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.traffic.hist import Histogram

from .precision_plan import routed_probs
from .sizes import dense_bytes_per_rank

UNMEASURED = ("the platform file records no GPU compute rate (`hotsplit probe -o platform.json` on the GPU "
              "machine measures it; older probes did not)")


def slowest_compute(platform: PlatformInfo) -> tuple[GpuInfo | None, str]:
    """The GPU whose compute rate at one token is the slowest (it bounds a step), or None and why."""
    measured = [g for g in platform.gpus if g.compute_points]
    if not measured or len(measured) < len(platform.gpus):
        return None, UNMEASURED
    return min(measured, key=lambda g: g.compute_gbps(1)), ""


def layer_compute_ms(gpu: GpuInfo, recipe: Recipe, hist: Histogram, hot_LE: np.ndarray, expert_bytes: int,
                     batches) -> list[float]:
    """A layer's compute in ms per decode step at each of `batches` (the module's model)."""
    pi_LE = routed_probs(hist.counts_LE, hist.top_k)
    dense = dense_bytes_per_rank(recipe) / recipe.model.num_hidden_layers
    L = hist.num_layers
    out = []
    for b in batches:
        touched_LE = 1.0 - (1.0 - pi_LE) ** b
        per_expert_tokens = b * hist.top_k / max(float(touched_LE.sum()) / L, 1e-9)
        hot_touched = float(touched_LE[hot_LE].sum()) / L
        out.append(dense / gpu.compute_gbps(b) / 1e6
                   + hot_touched * expert_bytes / gpu.compute_gbps(per_expert_tokens) / 1e6)
    return out
