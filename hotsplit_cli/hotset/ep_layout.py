"""How an expert-parallel run lays its experts out, in words for its header."""

from __future__ import annotations

from pathlib import Path

from .planfile import load_plan


def layout_words(plan_path: Path | None) -> str:
    """The plan's placement file, or the contiguous split (rank r holds experts r*E/R ..
    (r+1)*E/R-1 of every layer) and why: only the plan's JSON said so before."""
    if plan_path is None:
        return "layout contiguous (no plan)"
    pf = load_plan(plan_path)  # resolves a placement moved with the plan
    if pf.placement is None:
        return "layout contiguous: the plan was made without --placement"
    return f"placement {pf.placement['path']}"
