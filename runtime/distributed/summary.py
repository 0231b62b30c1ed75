"""The job's figures, gathered to rank 0 over the control group and reduced there by the
planning library (hotsplit_cli/hotset/ep_figures.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.hotset.ep_figures import (
    EPFigures,
    JobRecord,
    RankTotals,
    RankWindow,
    ep_figures,
    reduce_summaries,
    reduce_windows,
)
from hotsplit_cli.hotset.windows import RunSummary

from .dispatch import all_gather_single


def gather_rows(values, group) -> np.ndarray:
    """float64 [R, n]: every rank's `values` (the same length on every rank)."""
    mine = torch.as_tensor(np.asarray(values, dtype=np.float64).ravel())
    out = torch.empty(dist.get_world_size() * mine.numel(), dtype=torch.float64)
    all_gather_single(out, mine, group=group)
    return out.view(dist.get_world_size(), -1).numpy()


def gather_to_rank0(obj, group) -> list | None:
    """Collective: every rank's `obj` as a list on rank 0 (None elsewhere)."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


def job_record(window: RankWindow, group) -> JobRecord | None:
    """Collective: every rank's window to rank 0, reduced there (None elsewhere)."""
    windows = gather_to_rank0(window, group)
    return None if windows is None else reduce_windows(windows)


def job_summary(totals: RankTotals, group, window_steps: int | None = None) -> tuple[RunSummary, EPFigures] | None:
    """Collective: the job's summary and EP figures on rank 0 (None elsewhere)."""
    ranks = gather_to_rank0(dataclasses.replace(totals, summary=dataclasses.replace(totals.summary, records=[])),
                            group)
    return None if ranks is None else (reduce_summaries(ranks), ep_figures(ranks, window_steps))
