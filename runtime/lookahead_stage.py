"""Router lookahead in the runtime (`prefetch lookahead`): as soon as MoE layer l's output hidden
state exists (its residual stream, the shared experts' output included), layer l + 1's router is
applied to it and the cold experts it guesses are staged for layer l + 1, while what lies between
the two (attention on a checkpoint) runs.

One implementation for every model: `ranked` orders a router's experts (its own top-k first, then
by selection score) and gives each a probability; `GuessBook` counts the tokens' guesses against
the experts the layer then routes to (the counters `balance --model` records, hf/lookahead.py);
`LookaheadStager` stages, for each predicted layer, what `analysis/prefetch.choose_staged` takes
from the step's tokens' rankings (the rule `simulate` and `prefetch trace` stage by), and counts
what was staged as the trace predictor's stager does. A synthetic model calls it from its layer
loop (runtime/model.py), a checkpoint from the hooks of hf/lookahead.py.

The choice needs the guesses on the host: one synchronisation per predicted layer, and no CUDA
graph (a replay runs no Python between layers). Shape letters: T = tokens, E = experts,
K = top_k, G = guesses, L = MoE layers.
"""

from __future__ import annotations

import numpy as np
import torch

from hotsplit_cli.analysis.prefetch import choose_staged

from .prefetch import StagingPool, StepStager


def ranked(logits_TE: torch.Tensor, chosen_TK: torch.Tensor, sigmoid: bool,
           bias_E: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank_TE, q_TE): every expert per token, the router's chosen top-k first (exactly what it
    routes to, group limits included), then the others by selection score (sigmoid + correction
    bias for a sigmoid router, the logit otherwise), ties by expert id; and the router's
    probability of each expert (its sigmoid score, or the softmax over experts)."""
    logits_TE = logits_TE.float()
    score_TE = logits_TE.sigmoid() if sigmoid else logits_TE
    if bias_E is not None:
        score_TE = score_TE + bias_E.float()
    order_TE = torch.sort(score_TE, dim=-1, descending=True, stable=True).indices
    chosen_TE = torch.zeros_like(score_TE, dtype=torch.bool).scatter_(1, chosen_TK, True)
    first_TE = torch.sort(chosen_TE.gather(1, order_TE).to(torch.int8), dim=-1, descending=True, stable=True).indices
    q_TE = logits_TE.sigmoid() if sigmoid else logits_TE.softmax(dim=-1)
    return order_TE.gather(1, first_TE), q_TE


class GuessBook:
    """Per predicted MoE layer index (1..L-1): the tokens counted and their guesses (the first G of
    each token's ranking) that the layer then routed to; summed on the device, read once."""

    def __init__(self, num_layers: int, guesses: int, top_k: int):
        self.guesses, self.top_k = guesses, top_k
        self.tokens: list[torch.Tensor | int] = [0] * (num_layers - 1)
        self.useful: list[torch.Tensor | int] = [0] * (num_layers - 1)
        self._pending: list[torch.Tensor | None] = [None] * num_layers

    def guessed(self, row: int, guess_TG: torch.Tensor) -> None:
        self._pending[row] = guess_TG

    def routed(self, row: int, actual_TK: torch.Tensor, mask_T: torch.Tensor | None = None) -> None:
        """Layer `row` routed `actual_TK`; `mask_T` (bool) marks the tokens counted (None: all)."""
        if row == 0:
            return
        guess_TG, self._pending[row] = self._pending[row], None
        if guess_TG is None:
            raise RuntimeError(f"MoE layer index {row} routed before its lookahead was guessed")
        hit_TK = (actual_TK[:, :, None] == guess_TG[:, None, :]).any(-1)
        mask_T = torch.ones_like(hit_TK[:, 0]) if mask_T is None else mask_T.to(hit_TK.device)
        self.tokens[row - 1] = self.tokens[row - 1] + mask_T.sum()
        self.useful[row - 1] = self.useful[row - 1] + (hit_TK & mask_T[:, None]).sum()

    def counts(self) -> list[tuple[int, int]]:
        """(tokens, useful) per predicted layer (one host read)."""
        return [(int(t), int(u)) for t, u in zip(self.tokens, self.useful, strict=True)]

    def to_doc(self) -> dict:
        """The pooled counters, under the names of a histogram's `lookahead` block."""
        rows = self.counts()
        tokens, useful = sum(t for t, _ in rows), sum(u for _, u in rows)
        guesses, routed = tokens * self.guesses, tokens * self.top_k
        return {"guesses_per_token": self.guesses, "guesses": guesses, "useful": useful,
                "wasted": guesses - useful, "routed": routed, "recall": useful / routed if routed else 0.0}


class LookaheadStager(StepStager):
    """The staging of `prefetch lookahead`: decided inside the step, layer by layer (`ahead`),
    and counted after it against the step's routing, as the trace predictor's `Stager`."""

    def __init__(self, pool: StagingPool, num_experts: int, expert_bytes: int, book: GuessBook):
        super().__init__(pool, None, "the next layer's router", num_experts, expert_bytes)
        self.book = book

    def ahead(self, row: int, bank, rank_TE: torch.Tensor, q_TE: torch.Tensor,
              live_T: torch.Tensor | None = None, held_E: np.ndarray | None = None) -> None:
        """Layer `row`'s ranking and probabilities per token (from the layer before's output):
        stage its cold experts into `bank`'s staging rows and keep the first G guesses to count.
        `live_T`: the tokens counted (None: all); `held_E`: the experts this rank serves (None: all)."""
        G = self.pool.config.guesses
        self.book.guessed(row, rank_TE[:, :G])
        rank, q = rank_TE.cpu().numpy(), q_TE.cpu().numpy().astype(np.float64)  # the one sync per layer
        live = np.ones(len(rank), dtype=bool) if live_T is None else live_T.cpu().numpy().astype(bool)
        skip_E = bank.served_hot_E if held_E is None else bank.served_hot_E | ~held_E  # never guessed here
        self.stage_row(row, bank, choose_staged(rank, q, live, skip_E, self.staged_LE[row - 1], self.pool.config))

    def ahead_router(self, row: int, x_TH: torch.Tensor, router, bank, held_E: np.ndarray | None = None) -> None:
        """`ahead` for a synthetic model's layer `row`: its `Router` (moe.py) on `x_TH`, the layer
        before's output through the layer's input norm."""
        logits_TE = router.logits(x_TH)  # once: the choice and the ranking read the same logits
        chosen_TK, _ = router.route(logits_TE)
        rank_TE, q_TE = ranked(logits_TE, chosen_TK, router.geom.router == "sigmoid", router.bias_E)
        self.ahead(row, bank, rank_TE, q_TE, None, held_E)

    def summary(self, steps: int, cold_reads: int, copies: int, hits: float, assigned: float) -> dict:
        return {**super().summary(steps, cold_reads, copies, hits, assigned), "predictor": "lookahead",
                "lookahead": self.book.to_doc()}


def lookahead_stager(pool: StagingPool | None, prefetch: str, num_experts: int, top_k: int) -> LookaheadStager | None:
    """The stager of knob `prefetch` lookahead (None for any other mode); the banks reserve its
    staging rows (`BlobBank.reserve_staging`) as for the trace predictor."""
    if pool is None or prefetch != "lookahead":
        return None
    book = GuessBook(pool.num_layers, pool.config.guesses, top_k)
    return LookaheadStager(pool, num_experts, pool.expert_bytes, book)
