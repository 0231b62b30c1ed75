"""Router lookahead measured on a checkpoint: how well the next MoE layer's router, applied to the
hidden state one MoE layer early, guesses the experts that layer then routes to.

The hidden state is the output of the decoder layer of MoE layer i (its residual stream: the
attention and MoE outputs added, the shared experts included where the model has them), the
state that is ready while the next layer's experts could be copied. It goes through MoE layer
i + 1's own MoE input norm (`post_attention_layernorm`, every supported family's) and then its
router: what that layer would compute, skipping its attention. The guesses are the router's own
top-k (exactly the experts it would choose, group limits included), widened by the other experts
in order of its selection score (sigmoid + correction bias for DeepSeek-style routers, the
logit otherwise; ties by expert id) to G per token. Counted tokens are the routing counter's
(no padding, no finished sequence). The counters are hotset/lookahead.py's.

Shape letters: T = tokens of a forward pass, E = experts, G = guesses, K = top_k, H = hidden.
"""

from __future__ import annotations

import re

import torch

from hotsplit_cli.hotset.lookahead import LayerLookahead, Lookahead

from .loader import HFModel

_DECODER_RE = re.compile(r"(?:^|\.)layers\.(\d+)$")


def widened_guesses(router: torch.nn.Module, x_TH: torch.Tensor, guesses: int) -> torch.Tensor:
    """[T, G] expert ids: the router's top-k for `x_TH` first, then the rest by selection score."""
    logits_TE, _, chosen_TK = router(x_TH)
    score_TE = logits_TE.float()
    bias = getattr(router, "e_score_correction_bias", None)
    if bias is not None:  # DeepSeek-style: the router selects by sigmoid + bias
        score_TE = score_TE.sigmoid() + bias.float()
    order_TE = torch.sort(score_TE, dim=-1, descending=True, stable=True).indices
    chosen_TE = torch.zeros_like(score_TE, dtype=torch.bool).scatter_(1, chosen_TK, True)
    first_TE = torch.sort(chosen_TE.gather(1, order_TE).to(torch.int8), dim=-1, descending=True, stable=True).indices
    return order_TE.gather(1, first_TE)[:, :guesses]


class LookaheadCounter:
    """Hooks on `hm`'s decoder layers and routers that count, on the device, each predicted MoE
    layer's tokens and useful guesses; `result(measured_on)` reads them once, at the end."""

    def __init__(self, hm: HFModel, guesses: int):
        modules = dict(hm.model.named_modules())
        decoders = {int(m.group(1)): mod for name, mod in modules.items() if (m := _DECODER_RE.search(name))}
        self.hm, self.guesses = hm, min(guesses, hm.num_experts)
        self.tokens: list[torch.Tensor | int] = [0] * (len(hm.layers) - 1)
        self.useful: list[torch.Tensor | int] = [0] * (len(hm.layers) - 1)
        self._pending: list[torch.Tensor | None] = [None] * len(hm.layers)
        self._guessing = False
        self._handles = []
        for i, (src, dst) in enumerate(zip(hm.layers, hm.layers[1:], strict=False)):
            if dst.router is None or not hasattr(decoders.get(dst.layer_id), "post_attention_layernorm"):
                raise ValueError(f"MoE layer {dst.layer_id}: no router or post_attention_layernorm to apply early")
            guess = self._guess_hook(i + 1, decoders[dst.layer_id].post_attention_layernorm, dst.router)
            self._handles.append(decoders[src.layer_id].register_forward_hook(guess))
            self._handles.append(dst.router.register_forward_hook(self._count_hook(i + 1)))

    def _guess_hook(self, row: int, norm: torch.nn.Module, router: torch.nn.Module):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            self._guessing = True  # the early call of the router is not its layer's routing
            try:
                with torch.no_grad():
                    self._pending[row] = widened_guesses(router, norm(h).reshape(-1, h.shape[-1]), self.guesses)
            finally:
                self._guessing = False
        return hook

    def _count_hook(self, row: int):
        def hook(module, args, output):
            if self._guessing:
                return
            guess_TG, self._pending[row] = self._pending[row], None
            if guess_TG is None:
                raise RuntimeError(f"MoE layer {self.hm.layers[row].layer_id} routed before its lookahead was guessed")
            actual_TK = output[2]
            hit_TK = (actual_TK[:, :, None] == guess_TG[:, None, :]).any(-1)
            mask_T = self.hm.counter.token_mask_T  # the counted tokens (None: all)
            mask_T = torch.ones_like(hit_TK[:, 0]) if mask_T is None else mask_T.to(hit_TK.device)
            self.tokens[row - 1] = self.tokens[row - 1] + mask_T.sum()  # summed on the device, read once
            self.useful[row - 1] = self.useful[row - 1] + (hit_TK & mask_T[:, None]).sum()
        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def result(self, measured_on: str) -> Lookahead | None:
        """The counters as a histogram's `lookahead` block; None without two MoE layers or tokens.
        The hooks are removed first: the model routes as before."""
        self.close()
        tokens = [int(t) for t in self.tokens]
        if not tokens or tokens[0] == 0:
            return None
        ids, K = self.hm.layer_ids, self.hm.top_k
        rows = tuple(LayerLookahead(ids[i + 1], ids[i], t, t * self.guesses, int(u), t * K)
                     for i, (t, u) in enumerate(zip(tokens, self.useful, strict=True)))
        return Lookahead(measured_on, self.guesses, rows)
