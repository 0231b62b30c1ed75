"""The measured errors a plan is made with: a histogram's `quality` block (traffic/quality.py
reads and checks it; docs/precision.md has the schema) and the expected error of a choice of
precisions.

Shape letters: L = MoE layers, E = routed experts. The expected error of a choice of precisions
is the routing-share-weighted sum of the per-expert errors.
"""

from __future__ import annotations

import math
import os

import numpy as np

from hotsplit_cli.core.errors import HistogramError
from hotsplit_cli.core.jsonio import read_json
from hotsplit_cli.traffic.quality import MEASURED, Quality, quality_from_doc

__all__ = ["MEASURED", "Quality", "expected_error", "load_quality", "quality_from_doc"]


def load_quality(path: str | os.PathLike, shape: tuple[int, int]) -> Quality | None:
    """The `quality` block of the histogram at `path` (counts of `shape` [L, E], already read and
    checked by `load_hist`), or None when it has none. Strict: every problem names the field."""
    doc = read_json(path, HistogramError)
    block = doc.get("quality") if isinstance(doc, dict) else None
    return None if block is None else quality_from_doc(block, shape, str(path))


def expected_error(share_LE: np.ndarray, error_LE: np.ndarray) -> float:
    """sum of share x error over experts with traffic; inf when one of them has no measured error."""
    routed = share_LE > 0
    if np.isnan(error_LE[routed]).any():
        return math.inf
    return float((share_LE[routed] * error_LE[routed]).sum())
