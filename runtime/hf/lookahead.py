"""Router lookahead measured on a checkpoint: how well the next MoE layer's router, applied to the
hidden state one MoE layer early, guesses the experts that layer then routes to.

The hidden state is the output of the decoder layer of MoE layer i (its residual stream: the
attention and MoE outputs added, the shared experts included where the model has them), the
state that is ready while the next layer's experts could be copied. It goes through MoE layer
i + 1's own MoE input norm (`post_attention_layernorm`, every supported family's) and then its
router: what that layer would compute, skipping its attention. The guesses are the router's own
top-k (exactly the experts it would choose, group limits included), widened by the other experts
in order of its selection score (sigmoid + correction bias for DeepSeek-style routers, the
logit otherwise; ties by expert id) to G per token (`ranked` and `GuessBook` of
runtime/lookahead_stage.py, which `prefetch lookahead` stages with through these same hooks).
Counted tokens are the routing counter's (no padding, no finished sequence). The counters are
hotset/lookahead.py's.

Shape letters: T = tokens of a forward pass, E = experts, G = guesses, K = top_k, H = hidden.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from hotsplit_cli.hotset.lookahead import LayerLookahead, Lookahead

from ..lookahead_stage import GuessBook, ranked
from .loader import HFModel

_DECODER_RE = re.compile(r"(?:^|\.)layers\.(\d+)$")


def router_ranking(router: torch.nn.Module, x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank_TE, q_TE): a checkpoint's router on `x_TH`, every expert ranked (lookahead_stage.ranked)."""
    logits_TE, _, chosen_TK = router(x_TH)
    bias = getattr(router, "e_score_correction_bias", None)  # DeepSeek-style: selects by sigmoid + bias
    return ranked(logits_TE, chosen_TK, bias is not None, bias)


def widened_guesses(router: torch.nn.Module, x_TH: torch.Tensor, guesses: int) -> torch.Tensor:
    """[T, G] expert ids: the router's top-k for `x_TH` first, then the rest by selection score."""
    return router_ranking(router, x_TH)[0][:, :guesses]


class LookaheadCounter:
    """Hooks on `hm`'s decoder layers and routers that count, on the device, each predicted MoE
    layer's tokens and useful guesses (`book`); `result(measured_on)` reads them once, at the end.
    `on_guess(row, rank_TE, q_TE, mask_T)`, when given, is called with every predicted layer's
    ranking as it is made (what `prefetch lookahead` stages from, lookahead_stage.py)."""

    def __init__(self, hm: HFModel, guesses: int, on_guess: Callable | None = None, book: GuessBook | None = None):
        modules = dict(hm.model.named_modules())
        decoders = {int(m.group(1)): mod for name, mod in modules.items() if (m := _DECODER_RE.search(name))}
        self.hm, self.guesses, self.on_guess = hm, min(guesses, hm.num_experts), on_guess
        self.book = GuessBook(len(hm.layers), self.guesses, hm.top_k) if book is None else book
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
                    rank_TE, q_TE = router_ranking(router, norm(h).reshape(-1, h.shape[-1]))
            finally:
                self._guessing = False
            if self.on_guess is None:
                self.book.guessed(row, rank_TE[:, :self.guesses])
            else:
                self.on_guess(row, rank_TE, q_TE, self.hm.counter.token_mask_T)
        return hook

    def _count_hook(self, row: int):
        def hook(module, args, output):
            if not self._guessing:
                self.book.routed(row, output[2], self.hm.counter.token_mask_T)  # the counted tokens (None: all)
        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def result(self, measured_on: str) -> Lookahead | None:
        """The counters as a histogram's `lookahead` block; None without two MoE layers or tokens.
        The hooks are removed first: the model routes as before."""
        self.close()
        counts = self.book.counts()
        if not counts or counts[0][0] == 0:
            return None
        ids, K = self.hm.layer_ids, self.hm.top_k
        rows = tuple(LayerLookahead(ids[i + 1], ids[i], t, t * self.guesses, u, t * K)
                     for i, (t, u) in enumerate(counts))
        return Lookahead(measured_on, self.guesses, rows)
