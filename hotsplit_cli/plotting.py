"""PNG plots (matplotlib, an optional extra), written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable

from .errors import HotsplitError
from .jsonio import write_atomic


def save_png(path: str | os.PathLike, draw: Callable) -> None:
    """Call `draw(fig, ax)` on a fresh figure and write it to `path` as PNG, atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HotsplitError("--plot needs matplotlib", "pip install 'hotsplit[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    try:
        draw(fig, ax)
        fig.tight_layout()
        write_atomic(path, lambda fh: fig.savefig(fh, format="png"))
    finally:
        plt.close(fig)
