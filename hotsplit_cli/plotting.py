"""PNG plots (matplotlib, a dependency imported only when a plot is drawn), written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable

from hotsplit_cli.core.errors import HotsplitError
from hotsplit_cli.core.jsonio import write_atomic


def require_matplotlib() -> None:
    """Refuse --plot before any work when matplotlib cannot be imported (a broken install)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise HotsplitError("--plot needs matplotlib, a dependency of hotsplit missing from this environment",
                            "install it with `pip install 'matplotlib>=3.7'` (in a checkout ./setup.sh does)") from None


def save_png(path: str | os.PathLike, draw: Callable, figsize: tuple[float, float] = (7, 4), dpi: int = 110) -> None:
    """Call `draw(fig, ax)` on a fresh figure (`figsize` in inches) and write it to `path` as PNG
    at `dpi`, atomically."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize, dpi=dpi)
    try:
        draw(fig, ax)
        fig.tight_layout()
        write_atomic(path, lambda fh: fig.savefig(fh, format="png"))
    finally:
        plt.close(fig)


def integer_step_ticks(ax, steps) -> None:
    """x ticks at whole engine steps: at each point when there are few (a window's end), else
    integers chosen by matplotlib (its default puts 20.5 between two windows at 20 and 24)."""
    from matplotlib.ticker import MaxNLocator

    steps = sorted({int(s) for s in steps})
    if 0 < len(steps) <= 12:
        ax.set_xticks(steps)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
