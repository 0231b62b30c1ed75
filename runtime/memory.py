"""Will it fit? Checked before a byte is allocated, by every way of building a run (a recipe's
synthetic weights, runtime/from_recipe.py; a checkpoint, runtime/hf/loader.py): one rule, one
share, one error type (`RuntimeFailure`), and each caller's own words for what does not fit."""

from __future__ import annotations

import psutil
import torch

from hotsplit_cli.core.errors import RuntimeFailure
from hotsplit_cli.core.units import gib
from hotsplit_cli.hotset.host_memory import HOST_MEMORY_SHARE

from .device import DeviceInfo


def check_host_memory(n_bytes: int, what: str, hint: str) -> None:
    """Refuse to pin `n_bytes` beyond HOST_MEMORY_SHARE of the available host memory.
    `what` opens the message: `<what> <n> of host memory, <m> is available`."""
    available = psutil.virtual_memory().available
    if n_bytes > HOST_MEMORY_SHARE * available:
        raise RuntimeFailure(f"{what} {gib(n_bytes)} of host memory, {gib(available)} is available", hint)


def check_device_memory(n_bytes: int, info: DeviceInfo, what: str, hint: str) -> None:
    """Refuse to put `n_bytes` on a CUDA device that has less free (nothing to check on a CPU).
    `what` opens the message: `<what> <n> on <device>, <m> is free`."""
    if not info.is_cuda:
        return
    free, _ = torch.cuda.mem_get_info(info.device)
    if n_bytes > free:
        raise RuntimeFailure(f"{what} {gib(n_bytes)} on {info.name}, {gib(free)} is free", hint)
