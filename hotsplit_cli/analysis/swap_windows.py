"""The windows of a dynamic hot set: the hot set each window of steps runs with and the swaps the
runtime's rule makes after it (numpy only). Shared by `simulate`'s dynamic policy and the
staging replay, so both see the very same swaps."""

from __future__ import annotations

import numpy as np

from hotsplit_cli.config.knobs import DYN_DECAY, DYN_SIGMAS
from hotsplit_cli.hotset.admission import make_swap_rule


def dynamic_windows(counts_SLE: np.ndarray, hot_LE: np.ndarray, dyn_steps: int, max_swaps: int, margin: float,
                    decay: float = DYN_DECAY, rule: str = "credit", sigmas: float = DYN_SIGMAS):
    """Yield (start, end, hot [L, E], swaps made after the window) for each window of `dyn_steps`
    steps: the hot set the window's steps run with, then the rule's swaps for the next window."""
    S = counts_SLE.shape[0]
    propose = make_swap_rule(rule, decay, dyn_steps, sigmas)
    hot = np.array(hot_LE, dtype=bool)
    for start in range(0, S, dyn_steps):
        end = min(start + dyn_steps, S)
        if end >= S:
            yield start, end, hot.copy(), 0
            return
        swaps = propose(counts_SLE[start:end].sum(axis=0), hot, max_swaps, margin)
        yield start, end, hot.copy(), len(swaps)
        for s in swaps:
            hot[s.layer, s.out_expert] = False
            hot[s.layer, s.in_expert] = True
