"""The value rule of every count array hotsplit reads (histograms, live counts, serving-engine
dumps, placement windows): finite and >= 0, the first offending entry named. One rule, worded
by each caller for its own input."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotsplit_cli.core.errors import HotsplitError

NOT_FINITE = "not finite"
NEGATIVE = "negative"


def check_finite_nonneg(a: np.ndarray, error: type[HotsplitError],
                        message: Callable[[tuple[int, ...], str], str]) -> None:
    """Raise `error(message(index, problem))` for the first (row-major) entry of `a` that is not
    finite, else the first negative one; `problem` is NOT_FINITE or NEGATIVE."""
    for problem, bad in ((NOT_FINITE, ~np.isfinite(a)), (NEGATIVE, a < 0)):
        if bad.any():
            raise error(message(tuple(int(i) for i in np.argwhere(bad)[0]), problem))


def index_str(index: tuple[int, ...]) -> str:
    """`(1, 2)` -> `[1][2]`, as a JSON path names an entry."""
    return "".join(f"[{i}]" for i in index)
