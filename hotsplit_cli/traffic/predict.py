"""Next-layer expert predictors fitted on a routing trace (numpy only; never imports torch).

Shape letters: N = tokens (the trace's steps x tokens per step, in recorded order), L = MoE
layers, E = experts, K = top_k, G = guesses.

Each predictor gives, for every token and MoE layer index l >= 1, a probability per expert
that the token routes to it at layer l, from what is known while layer l - 1 computes, and
ranks them into G guesses (G > K widens past top-k):
- `cooccur`: the cross-layer co-activation table. q(b) = mean over the token's experts a at
  layer l - 1 of P(b at layer l | a at layer l - 1), counted on the fit trace.
- `previous`: the previous token of the same sequence (the trace is read as one sequence in
  its recorded order). Its layer-l experts come first, each with q = P(b at token n | b at
  token n - 1); the rest follow with q = P(b at n | b not at n - 1). The trace's first token
  has no previous one: every expert takes the second probability.
- `frequent`: the most frequent experts of layer l on the fit trace, q = their token share.
Ties rank by the fit trace's frequency at layer l, then by expert id, so guesses are fully
determined. Layer index 0 is never predicted (nothing computes before it). docs/prefetch.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.core.holdout import MIN_WINDOWS, Band, origins_of

from .trace import Trace

PREDICTORS = ("cooccur", "previous", "frequent")


def token_members_NLE(trace: Trace, num_experts: int) -> np.ndarray:
    """bool [N, L, E]: whether token n routes to expert e at MoE layer index l (padding: none)."""
    S, L, T, K = trace.topk_ids_SLTK.shape
    return members_NLE(np.moveaxis(trace.topk_ids_SLTK, 1, 2).reshape(S * T, L, K), num_experts)


def members_NLE(ids_NLK: np.ndarray, num_experts: int) -> np.ndarray:
    """bool [N, L, E] of expert ids int [N, L, K] (-1 = padding, in no expert)."""
    N, L, _ = ids_NLK.shape
    ids_NLK = np.asarray(ids_NLK, dtype=np.int64)
    member = np.zeros((N, L, num_experts + 1), dtype=bool)  # column E takes the padding (-1)
    np.put_along_axis(member, np.where(ids_NLK < 0, num_experts, ids_NLK), True, axis=2)
    return member[:, :, :num_experts]


def _share(count: np.ndarray, total: np.ndarray) -> np.ndarray:
    return np.divide(count, total, out=np.zeros(np.broadcast_shapes(count.shape, total.shape)), where=total > 0)


@dataclass(frozen=True)
class NextLayerPredictor:
    """A fitted predictor: `kind` in PREDICTORS and what it learned from the fit trace."""

    kind: str
    freq_LE: np.ndarray  # float [L, E]: share of the fit trace's tokens routed to e at layer l
    cooccur_LEE: np.ndarray  # float [L - 1, E, E]: P(b at l + 1 | a at l), [l, a, b]
    stay_LE: np.ndarray  # float [L, E]: P(e at token n | e at token n - 1)
    enter_LE: np.ndarray  # float [L, E]: P(e at token n | e not at token n - 1)

    def probs_NE(self, member_NLE: np.ndarray, layer: int) -> np.ndarray:
        """float [N, E]: each token's probability of routing to e at MoE layer index `layer` >= 1."""
        if not 1 <= layer < member_NLE.shape[1]:
            raise PlanError(f"layer index {layer} has no previous MoE layer to predict it from")
        if self.kind == "cooccur":
            prev = member_NLE[:, layer - 1].astype(np.float64)
            return _share(prev @ self.cooccur_LEE[layer - 1], prev.sum(axis=1, keepdims=True))
        if self.kind == "previous":
            before = self._previous_NE(member_NLE, layer)
            return np.where(before, self.stay_LE[layer], self.enter_LE[layer])
        return np.broadcast_to(self.freq_LE[layer], (member_NLE.shape[0], member_NLE.shape[2]))

    def rank_NE(self, member_NLE: np.ndarray, layer: int, q_NE: np.ndarray | None = None) -> np.ndarray:
        """int [N, E]: each token's experts at `layer`, best guess first (ties by frequency, then id).
        `q_NE`: `probs_NE` of the same arguments, when the caller has it already."""
        q = self.probs_NE(member_NLE, layer) if q_NE is None else q_NE
        N, E = q.shape
        ids = np.broadcast_to(np.arange(E), (N, E))
        freq = np.broadcast_to(-self.freq_LE[layer], (N, E))
        first = -self._previous_NE(member_NLE, layer).astype(np.int8) if self.kind == "previous" else np.zeros((N, E))
        return np.lexsort((ids, freq, -q, first), axis=-1)

    @staticmethod
    def _previous_NE(member_NLE: np.ndarray, layer: int) -> np.ndarray:
        before = np.zeros(member_NLE.shape[::2], dtype=bool)
        before[1:] = member_NLE[:-1, layer]
        return before


def fit_predictor(kind: str, member_NLE: np.ndarray) -> NextLayerPredictor:
    """Fit predictor `kind` on the fit trace's token memberships (bool [N, L, E])."""
    if kind not in PREDICTORS:
        raise PlanError(f"unknown predictor {kind!r}", f"predictors are: {', '.join(PREDICTORS)}")
    m = member_NLE.astype(np.float64)
    N, L, E = m.shape
    routed_N = member_NLE.any(axis=2).sum(axis=0)  # tokens with an expert per layer [L]
    freq = _share(m.sum(axis=0), routed_N[:, None].astype(np.float64))
    pair = np.einsum("nla,nlb->lab", m[:, :-1], m[:, 1:])  # [L - 1, E, E] tokens with a at l and b at l + 1
    cooccur = _share(pair, m[:, :-1].sum(axis=0)[:, :, None])
    both = (m[1:] * m[:-1]).sum(axis=0)  # [L, E] tokens whose previous token also routed to e
    was = m[:-1].sum(axis=0)
    stay = _share(both, was)
    enter = _share(m[1:].sum(axis=0) - both, (N - 1) - was)
    return NextLayerPredictor(kind, freq, cooccur, stay, enter)


@dataclass(frozen=True)
class PredictionCounts:
    """The counters every predictor is judged by, summed over tokens and predicted layers."""

    guesses: int  # G per token and layer
    predicted: int  # guesses of cold experts (a hot expert is never guessed)
    useful: int  # guesses the token then routed to
    cold_reads: int  # the tokens' routed assignments to cold experts
    routed: int  # every routed assignment of the predicted layers

    @property
    def wasted(self) -> int:
        return self.predicted - self.useful

    @property
    def covered(self) -> float:
        """The share of cold reads a guess covered."""
        return self.useful / self.cold_reads if self.cold_reads else 0.0

    def to_doc(self) -> dict:
        return {"guesses": self.guesses, "predicted": self.predicted, "useful": self.useful, "wasted": self.wasted,
                "cold_reads": self.cold_reads, "covered": self.covered}


def count_predictions(predictor: NextLayerPredictor, member_NLE: np.ndarray, guesses: int,
                      hot_LE: np.ndarray | None = None) -> PredictionCounts:
    """Per token and MoE layer index l >= 1, the first `guesses` cold experts of the ranking
    against the experts the token routed to at l. Without `hot_LE` every expert is cold, and
    `covered` is the per-token recall at `guesses`."""
    N, L, E = member_NLE.shape
    if not 1 <= guesses <= E:
        raise PlanError(f"guesses must be in 1..{E}, got {guesses}")
    hot = np.zeros((L, E), dtype=bool) if hot_LE is None else np.asarray(hot_LE, dtype=bool)
    predicted = useful = cold = routed = 0
    for layer in range(1, L):
        rank = predictor.rank_NE(member_NLE, layer)
        guess = _drop_hot(rank, hot[layer])[:, :guesses]
        actual = member_NLE[:, layer]
        live = actual.any(axis=1)  # tokens routed at this layer (not padding)
        hit = np.take_along_axis(actual, guess, axis=1)[live]
        predicted += guess.shape[1] * int(live.sum())
        useful += int(hit.sum())
        cold += int((actual & ~hot[layer]).sum())
        routed += int(actual.sum())
    return PredictionCounts(guesses, predicted, useful, cold, routed)


def _drop_hot(rank_NE: np.ndarray, hot_E: np.ndarray) -> np.ndarray:
    """The ranking without the hot experts (every row drops the same ones, order kept)."""
    keep = ~hot_E[rank_NE]
    return rank_NE[keep].reshape(rank_NE.shape[0], int(keep[0].sum()))


@dataclass(frozen=True)
class MeasuredRecall:
    """A predictor's pooled recall as the prefetch planner prices it: the share `recall` of the
    next layer's routed experts within the first `guesses` guesses per token, over `tokens`
    tokens, with `wasted_per_useful` wrong guesses per right one (router lookahead's comes from
    a histogram's `lookahead` block, hotset/lookahead.py)."""

    recall: float  # in [0, 1]
    wasted_per_useful: float  # >= 0 (inf: no guess was useful)
    guesses: int  # >= 1
    tokens: int  # >= 1


def rolling_recall(kind: str, member_NLE: np.ndarray, tokens_per_window: int, guesses: int) -> dict:
    """The predictor's per-token recall at `guesses` on windows it has not seen, as `plan` judges hit
    rates (core/holdout.py): refitted on windows [0, k) and judged on window k, for the later half
    of the windows; the pooled recall and the lowest and highest window's."""
    W = member_NLE.shape[0] // tokens_per_window
    if W < MIN_WINDOWS:
        return {"available": False, "reason": f"the trace has {W} window of {tokens_per_window} tokens; a held-out "
                                              f"recall needs at least {MIN_WINDOWS}"}
    useful, cold, rates = 0, 0, []
    for k in origins_of(W):
        judged = member_NLE[k * tokens_per_window:(k + 1) * tokens_per_window]
        c = count_predictions(fit_predictor(kind, member_NLE[:k * tokens_per_window]), judged, guesses)
        useful, cold = useful + c.useful, cold + c.cold_reads
        rates.append(c.covered)
    band = Band(useful / cold if cold else 0.0, min(rates), max(rates))
    return {"available": True, "method": "rolling origin: refit on windows [0, k), judged on window k",
            "origins": list(origins_of(W)), **band.to_doc()}
