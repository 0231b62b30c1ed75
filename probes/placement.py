"""Host buffers placed on one NUMA node, with the placement checked in /proc/self/numa_maps.

A buffer is an anonymous mmap whose pages get an `mbind(MPOL_PREFERRED, node)` policy before
they are first touched, so the kernel allocates them on that node. PREFERRED rather than BIND:
a node that runs out falls back to another instead of invoking the OOM killer, and the numa_maps
check then reports the buffer as misplaced rather than the probe dying.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import read_text

# mbind(2) syscall numbers per architecture (Linux uapi unistd tables).
SYS_MBIND = {"x86_64": 237, "aarch64": 235, "ppc64le": 259, "ppc64": 259}
MPOL_PREFERRED = 1
MPOL_MF_MOVE = 1 << 1
VERIFIED_FRACTION = 0.99  # share of the buffer's pages that must sit on the wanted node


def parse_numa_maps(text: str) -> list[tuple[int, str, dict[int, int]]]:
    """/proc/<pid>/numa_maps as [(start address, policy, {node: pages})], in file order."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            start = int(parts[0], 16)
        except ValueError:
            continue
        pages = {int(m.group(1)): int(m.group(2)) for m in (re.fullmatch(r"N(\d+)=(\d+)", p) for p in parts[2:]) if m}
        out.append((start, parts[1], pages))
    return out


def node_pages_at(text: str, address: int) -> dict[int, int] | None:
    """Pages per node of the mapping that contains `address` (the last one starting at or before it)."""
    best = None
    for start, _policy, pages in parse_numa_maps(text):
        if start <= address and (best is None or start >= best[0]):
            best = (start, pages)
    return None if best is None else best[1]


@dataclass(frozen=True)
class Placement:
    """Where a buffer's pages are: share per node, and whether they sit on the wanted node."""

    wanted_node: int | None
    share_by_node: dict[int, float]
    verified: bool | None  # None: could not check (no numa_maps)
    detail: str | None = None


def bind_to_node(address: int, size_bytes: int, node: int) -> str | None:
    """Set MPOL_PREFERRED for node on [address, address + size). Returns None, or why it failed."""
    number = SYS_MBIND.get(platform.machine())
    if number is None:
        return f"mbind syscall number unknown for {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    rc = libc.syscall(ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_ulong(size_bytes),
                      ctypes.c_int(MPOL_PREFERRED), mask, ctypes.c_ulong(words * 64 + 1),
                      ctypes.c_uint(MPOL_MF_MOVE))
    if rc != 0:
        return f"mbind to node {node} failed: {os.strerror(ctypes.get_errno())}"
    return None


class HostBuffer:
    """A page-aligned host buffer of `size_bytes`, its pages allocated on `node` (None: anywhere).

    Use as a context manager; `array` is a uint8 numpy view, `address` its first byte.
    """

    def __init__(self, size_bytes: int, node: int | None, numa_maps: Path = Path("/proc/self/numa_maps")):
        self.size_bytes = size_bytes
        self.node = node
        self._map = mmap.mmap(-1, size_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.address = self.array.ctypes.data
        self.bind_error = bind_to_node(self.address, size_bytes, node) if node is not None else None
        self.array.fill(1)  # first touch: the pages are allocated now, under the policy
        self.placement = self._check(numa_maps)

    def _check(self, numa_maps: Path) -> Placement:
        text = read_text(numa_maps)
        pages = node_pages_at(text, self.address) if text is not None else None
        if not pages:
            return Placement(self.node, {}, None, f"{numa_maps} unreadable or has no entry for the buffer")
        total = sum(pages.values())
        share = {n: c / total for n, c in sorted(pages.items())}
        if self.node is None:
            return Placement(None, share, None, "not bound to a node")
        ok = share.get(self.node, 0.0) >= VERIFIED_FRACTION
        detail = self.bind_error or (None if ok else f"only {share.get(self.node, 0.0):.0%} of pages on node "
                                                     f"{self.node} (node short of free memory?)")
        return Placement(self.node, share, ok, detail)

    def close(self) -> None:
        # Views must go before the mapping can close; a still-exported buffer stays mapped
        # until the last view dies (BufferError), which is harmless.
        del self.array
        try:
            self._map.close()
        except BufferError:
            pass

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
