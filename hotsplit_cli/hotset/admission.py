"""The break-even swap rule, priced in PCIe bytes, and the choice between it and the credit rule
(numpy only; never imports torch). Shape letters: L = MoE layers, E = experts.

Both rules see what the runtime sees once per window (its one host synchronisation): the
window's routed-assignment counts per (layer, expert) and the hot mask. Both are called like
`planner.propose_swaps` and keep each layer's number of hot slots.

Break-even (`dyn_rule breakeven`). Each expert keeps a decayed count `score = decay x score +
counts` and the decayed number of steps it covers, `steps = decay x steps + dyn_steps`, so
`rate = score / steps` is its expected assignments per step. A cold expert costs one read per
step in which it is active, with chance `p = 1 - exp(-rate)` (Poisson arrivals); bringing it in
costs one copy, the bytes of one read. The score remembers about `horizon = dyn_steps / (1 -
decay)` steps (all of them at decay 1), the time a swap is expected to keep paying. Per layer,
the i-th strongest cold expert replaces the i-th weakest hot one while the pair passes all of:
- it pays for its copy: `horizon x (p_in - p_out) > 1` (cold reads saved over the horizon
  exceed the one copy);
- `dyn_margin`, as in the credit rule: `score_in > margin x score_out`;
- it is not noise: `score_in - score_out > dyn_sigmas x sqrt(score_in + score_out)`, the lead
  measured in Poisson standard deviations of the two counts. Stationary traffic moves the
  experts at the edge of the hot set by about one deviation from window to window, a task
  switch by many;
- at most `dyn_max_swaps` pairs per layer.
Each test only gets harder down the pairs (stronger in, weaker out first), so the first failure
ends the layer's swaps. docs/simulate.md has the measurements behind the defaults.
"""

from __future__ import annotations

import math

import numpy as np

from hotsplit_cli.config.knobs import DYN_RULES  # the seed's window rule (planner.SwapRule), the one here
from hotsplit_cli.core.errors import PlanError

from .planner import Swap, SwapRule, check_window


class BreakEvenRule:
    """The break-even rule with its decayed scores, one instance per run (runtime and simulator)."""

    def __init__(self, decay: float, window_steps: int, sigmas: float):
        if not 0.0 <= decay <= 1.0:
            raise PlanError(f"swap decay must be in [0, 1], got {decay}")
        if window_steps < 1 or not sigmas >= 0.0:
            raise PlanError(f"bad break-even knobs: window_steps={window_steps}, sigmas={sigmas}")
        self.decay, self.window_steps, self.sigmas = float(decay), int(window_steps), float(sigmas)
        self.horizon = math.inf if decay == 1.0 else window_steps / (1.0 - decay)  # steps a swap pays over
        self.score_LE: np.ndarray | None = None
        self.steps = 0.0  # decayed steps the score covers

    def __call__(self, counts_LE: np.ndarray, hot_LE: np.ndarray, max_swaps: int, margin: float) -> list[Swap]:
        counts_LE, hot_LE = check_window(counts_LE, hot_LE, self.score_LE)
        if max_swaps < 0 or margin < 1.0:
            raise PlanError(f"bad swap knobs: max_swaps={max_swaps}, margin={margin}")
        self.score_LE = counts_LE if self.score_LE is None else self.decay * self.score_LE + counts_LE
        self.steps = self.decay * self.steps + self.window_steps
        return [s for layer in range(counts_LE.shape[0]) for s in self._layer(layer, hot_LE[layer], max_swaps, margin)]

    def _layer(self, layer: int, hot_E: np.ndarray, max_swaps: int, margin: float) -> list[Swap]:
        """One layer's swaps: strongest cold against weakest hot, while every test passes."""
        score = self.score_LE[layer]
        ids = np.arange(len(score))
        cold_ids, hot_ids = ids[~hot_E], ids[hot_E]
        ins = cold_ids[np.lexsort((cold_ids, -score[cold_ids]))][:max_swaps]  # ties by expert id
        outs = hot_ids[np.lexsort((hot_ids, score[hot_ids]))][:max_swaps]
        swaps = []
        for e_in, e_out in zip(ins, outs, strict=False):
            s_in, s_out = float(score[e_in]), float(score[e_out])
            if not self.pays(s_in, s_out, margin):
                break
            swaps.append(Swap(layer, int(e_out), int(e_in), s_in, s_out))
        return swaps

    def pays(self, s_in: float, s_out: float, margin: float) -> bool:
        """Whether bringing in a cold expert of decayed score `s_in` for a hot one of `s_out` pays."""
        p_in, p_out = (1.0 - math.exp(-s / self.steps) for s in (s_in, s_out))
        return (copy_pays(self.horizon * (p_in - p_out)) and s_in > margin * s_out
                and s_in - s_out > self.sigmas * math.sqrt(s_in + s_out))


def copy_pays(reads_saved: float, copy_price: float = 1.0) -> bool:
    """The one admission rule of every move into GPU memory (a swap, a prefetch): the expected
    cold reads it saves exceed its copy, priced in cold reads of the same bytes. A swap's copy
    costs one read (`copy_price` 1); a prefetch's copy costs the share of it that compute does not
    hide (analysis/prefetch.py)."""
    return reads_saved > copy_price


def make_swap_rule(rule: str, decay: float, window_steps: int, sigmas: float):
    """A fresh rule for one run, by its `dyn_rule` name."""
    if rule == "credit":
        return SwapRule(decay)
    if rule == "breakeven":
        return BreakEvenRule(decay, window_steps, sigmas)
    raise PlanError(f"unknown swap rule {rule!r}", f"dyn_rule is one of {', '.join(DYN_RULES)}")
