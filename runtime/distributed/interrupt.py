"""Ctrl-C in an expert-parallel run stops the job at the next window, as on one rank: a rank cannot
stop alone mid-exchange, so SIGINT raises a flag the ranks all-reduce at every window. Our
launcher passes a terminal's Ctrl-C on; a second one stops the job at once."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from .leftovers import stat_fields

_asked = {"stop": False}  # process-wide on purpose: set by the SIGINT handler, which no caller can hand an object


def stop_at_next_window() -> None:
    """In a rank: SIGINT asks the job to stop at its next window instead of raising
    KeyboardInterrupt wherever the rank is (mid-collective)."""
    _asked["stop"] = False
    signal.signal(signal.SIGINT, lambda *_: _asked.update(stop=True))


def job_stops(group=None) -> bool:
    """Collective (every rank, at the same step): whether any rank was asked to stop."""
    flag = torch.tensor([1 if _asked["stop"] else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (the ranks torch's agent started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat)
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(stat.parent.name))
    return found


@contextmanager
def forward_interrupts():
    """In our launcher: the first SIGINT goes to every rank (they stop at the next window), a second
    raises KeyboardInterrupt here. Yields {"interrupted": whether a SIGINT came}."""
    state = {"interrupted": False}

    def on_sigint(*_):
        if state["interrupted"]:
            raise KeyboardInterrupt
        state["interrupted"] = True
        for pid in _children(os.getpid()):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
