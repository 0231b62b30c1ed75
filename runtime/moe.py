"""MoE building blocks: geometry, routers, SwiGLU experts, shared experts, the reference. The
grouped expert compute (`expert_groups`, `grouped_experts`, `stacked_experts`) lives in
probes/cpu_expert.py, so that the CPU expert rate is measured on the very code a run computes with.

Shape letters: T = tokens, K = top_k, E = routed experts, H = hidden, I = expert intermediate,
G = router groups. Expert weights are stacked `[E, ...]` and gathered by index (no ModuleList):
`w13_EIH` [E, 2I, H] holds gate rows then up rows, `w2_EHI` [E, H, I] the down projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from hotsplit_probes.cpu_expert import grouped_experts

from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.hotset.sizes import scaled_dim

from .precision import StoredExperts, StoredFormat

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class MoEGeometry:
    """The allocated geometry of one MoE layer (scaled); routing parameters are the model's."""

    hidden: int
    inter: int  # per routed expert, this rank's slice (I / tp)
    num_experts: int
    top_k: int
    shared_inter: int  # all shared experts together, this rank's slice (0 = none)
    router: str  # softmax | sigmoid
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    @property
    def blob_elems(self) -> int:
        """Elements of one expert blob: w13 [2I, H] then w2 [H, I]."""
        return 3 * self.inter * self.hidden

    @classmethod
    def from_recipe(cls, recipe: Recipe, scale: float, multiple: int = 8) -> MoEGeometry:
        """`multiple`: what the expert dims are rounded to when `scale` shrinks them."""
        m, tp = recipe.model, recipe.parallel.tp
        return cls(
            hidden=scaled_dim(m.hidden_size, scale, multiple),
            inter=scaled_dim(m.moe_intermediate_size // tp, scale, multiple),
            num_experts=m.num_experts,
            top_k=m.top_k,
            shared_inter=scaled_dim(m.shared_intermediate_size // tp, scale) if m.shared_intermediate_size else 0,
            router=m.router,
            n_group=m.n_group,
            topk_group=m.topk_group,
            norm_topk_prob=m.norm_topk_prob,
            routed_scaling_factor=m.routed_scaling_factor,
        )


@dataclass
class Router:
    """Top-k routing. `softmax`: softmax over experts then top-k. `sigmoid` (DeepSeek-V3):
    sigmoid scores, selection on scores + `bias_E` (e_score_correction_bias) restricted to the
    best `topk_group` of `n_group` groups (a group scores the sum of its top-2), weights are the
    unbiased scores of the chosen experts. Then optional renormalisation and scaling."""

    weight_EH: torch.Tensor  # float32 [E, H]
    bias_E: torch.Tensor | None  # float32 [E], sigmoid router only
    geom: MoEGeometry

    def to(self, device) -> Router:
        return Router(self.weight_EH.to(device), None if self.bias_E is None else self.bias_E.to(device), self.geom)

    def __call__(self, x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (ids_TK int64, weights_TK float32). No host synchronisation."""
        return self.route(self.logits(x_TH))

    def logits(self, x_TH: torch.Tensor) -> torch.Tensor:
        """The router's logits [T, E] in float32."""
        return F.linear(x_TH.float(), self.weight_EH)

    def route(self, logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids_TK, weights_TK) from the logits (`logits`)."""
        g = self.geom
        if g.router == "softmax":
            scores_TE = logits_TE.softmax(dim=-1)
            weights_TK, ids_TK = torch.topk(scores_TE, g.top_k, dim=-1)
        else:
            scores_TE = logits_TE.sigmoid()
            choice_TE = scores_TE + self.bias_E if self.bias_E is not None else scores_TE
            if g.n_group > 1:
                T, E = choice_TE.shape
                per_group = E // g.n_group
                choice_TGX = choice_TE.view(T, g.n_group, per_group)
                group_TG = choice_TGX.topk(min(2, per_group), dim=-1).values.sum(dim=-1)
                keep_TG = torch.zeros_like(group_TG, dtype=torch.bool)
                keep_TG.scatter_(1, group_TG.topk(g.topk_group, dim=-1).indices, True)
                choice_TE = choice_TGX.masked_fill(~keep_TG[:, :, None], float("-inf")).view(T, E)
            ids_TK = torch.topk(choice_TE, g.top_k, dim=-1).indices
            weights_TK = scores_TE.gather(1, ids_TK)
        if g.norm_topk_prob:
            weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
        return ids_TK, weights_TK * g.routed_scaling_factor


def swiglu(x_TH: torch.Tensor, w13_NH: torch.Tensor, w2_HI: torch.Tensor) -> torch.Tensor:
    """One SwiGLU MLP: w2 (silu(gate x) * up x); w13 holds gate rows then up rows."""
    gate_TI, up_TI = F.linear(x_TH, w13_NH).chunk(2, dim=-1)
    return F.linear(F.silu(gate_TI) * up_TI, w2_HI)


def expert_counts(ids_TK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Routed assignments per expert of one step (int64 [E]); -1 marks padding."""
    flat = ids_TK.reshape(-1)
    counts_E = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    return counts_E.scatter_add_(0, flat.clamp(min=0), (flat >= 0).long())  # no host sync


@dataclass
class LayerWeights:
    """One MoE layer's weights on the host (float32 or the run dtype). With `stored`, the routed
    experts are stored quantised (fp8 or mxfp4, runtime/precision.py) and w13/w2 hold their
    dequantised values (what the reference computes with)."""

    w13_EIH: torch.Tensor
    w2_EHI: torch.Tensor
    router: Router
    shared_w13: torch.Tensor | None  # [2Is, H]
    shared_w2: torch.Tensor | None  # [H, Is]
    stored: StoredExperts | None = None
    # An auto plan's layer of several precisions: (expert ids, their stored experts or None for
    # native) per precision, one sub-bank each (runtime/mixed_bank.py); `stored` is then None.
    parts: list[tuple[np.ndarray, StoredExperts | None]] | None = None


def make_layer_weights(geom: MoEGeometry, seed: int, dtype: torch.dtype,
                       stored: StoredFormat | None = None) -> LayerWeights:
    """Random weights with the usual 1/sqrt(fan_in) scale, deterministic in `seed` (CPU); with
    `stored` the routed experts are quantised to that format (block-scaled e4m3, or mxfp4)."""
    gen = torch.Generator().manual_seed(seed)
    E, H, inter = geom.num_experts, geom.hidden, geom.inter

    def randn(*shape, fan_in):
        return (torch.randn(*shape, generator=gen) / fan_in ** 0.5).to(dtype)

    w13 = randn(E, 2 * inter, H, fan_in=H)
    w2 = randn(E, H, inter, fan_in=inter)
    router_w = torch.randn(E, H, generator=gen) / H ** 0.5
    bias = (torch.rand(E, generator=gen) - 0.5) * 0.1 if geom.router == "sigmoid" else None
    sw13 = sw2 = None
    if geom.shared_inter:
        sw13 = randn(2 * geom.shared_inter, H, fan_in=H)
        sw2 = randn(H, geom.shared_inter, fan_in=geom.shared_inter)
    q = None
    if stored is not None:
        q = stored.quantize_experts(w13, w2)
        w13, w2 = q.dequantized(dtype)
    return LayerWeights(w13, w2, Router(router_w, bias, geom), sw13, sw2, q)


def rms_norm(x_TH: torch.Tensor) -> torch.Tensor:
    x = x_TH.float()
    return (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)).to(x_TH.dtype)


class ReferenceMoE:
    """The all-resident reference: every expert stacked on the device, grouped by expert."""

    def __init__(self, layers: list[LayerWeights], device: torch.device):
        self.layers = []
        for lw in layers:
            self.layers.append(LayerWeights(
                lw.w13_EIH.to(device), lw.w2_EHI.to(device), lw.router.to(device),
                None if lw.shared_w13 is None else lw.shared_w13.to(device),
                None if lw.shared_w2 is None else lw.shared_w2.to(device)))

    def layer(self, li: int, x_TH: torch.Tensor, ids_TK: torch.Tensor | None = None,
              w_TK: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lw = self.layers[li]
        if ids_TK is None:
            ids_TK, w_TK = lw.router(x_TH)
        w13, w2 = lw.w13_EIH, lw.w2_EHI
        y = grouped_experts(x_TH, ids_TK, w_TK, lambda e: (w13[e], w2[e]), w13.shape[0])
        if lw.shared_w13 is not None:
            y = y + swiglu(x_TH, lw.shared_w13, lw.shared_w2)
        return y, ids_TK, w_TK

    def step(self, x_TH: torch.Tensor, ids_LTK: torch.Tensor | None = None,
             w_LTK: torch.Tensor | None = None) -> torch.Tensor:
        """The stack: h = h + moe(rms_norm(h)) per layer."""
        return self.routed_step(x_TH, ids_LTK, w_LTK)[0]

    def routed_step(self, x_TH: torch.Tensor, ids_LTK: torch.Tensor | None = None,
                    w_LTK: torch.Tensor | None = None) -> tuple[torch.Tensor, list, list]:
        """`step`, and the routing each layer used (ids and weights [T, K] per layer)."""
        h, ids, ws = x_TH, [], []
        for li in range(len(self.layers)):
            y, ids_TK, w_TK = self.layer(li, rms_norm(h), None if ids_LTK is None else ids_LTK[li],
                                         None if w_LTK is None else w_LTK[li])
            ids.append(ids_TK)
            ws.append(w_TK)
            h = h + y
        return h, ids, ws
