"""What every probe shares: reasons for unread fields, the driver's view of a GPU, and plain helpers.

A probe never raises for something it could not read: the field is `None` and a `Reason` names
the field (relative to the dataclass that holds it) and why. `collect_reasons` turns the tree of
reasons into the `reasons` list of platform.json with JSON paths (`gpus[0].mem_reserved_bytes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reason:
    """Why `field` of the enclosing object is None (or was read from a fallback source)."""

    field: str
    why: str


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the driver reports it (NVML, or nvidia-smi when NVML is unusable from Python)."""

    index: int  # the driver's index (nvidia-smi order), not CUDA's
    name: str | None
    uuid: str | None
    pci_bus_id: str | None  # as the driver prints it, e.g. 00000000:3B:00.0
    mem_total_bytes: int | None
    mem_used_bytes: int | None
    mem_free_bytes: int | None
    mem_reserved_bytes: int | None  # firmware / driver reserved, never allocatable
    pcie_gen_current: int | None  # idle links train down: read this under load too
    pcie_gen_max: int | None  # max of this GPU in this slot (the lower of GPU and host)
    pcie_gen_gpu_max: int | None  # what the GPU itself supports
    pcie_width_current: int | None  # lanes
    pcie_width_max: int | None
    numa_node: int | None
    cpu_affinity: tuple[int, ...] | None  # CPU ids closest to the GPU
    memory_affinity: tuple[int, ...] | None  # NUMA node ids closest to the GPU
    source: str  # "nvml" | "nvidia-smi" | "cuda"
    reasons: tuple[Reason, ...] = ()

    @classmethod
    def unreadable(cls, index: int, why: str, source: str) -> GpuDevice:
        """A GPU that is listed but cannot be opened: every field None with the same reason."""
        fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("index", "source", "reasons")]
        return cls(index, *([None] * len(fields)), source=source,
                   reasons=tuple(Reason(name, why) for name in fields))


@dataclass(frozen=True)
class DriverReport:
    """Every GPU one source could see, or why it saw none."""

    source: str
    available: bool
    driver_version: str | None
    gpus: tuple[GpuDevice, ...]
    reason: str | None  # set when available is False


def to_doc(obj: Any) -> Any:
    """A dataclass tree as JSON-ready data: dicts in field order, tuples as lists, no `reasons`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_doc(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "reasons"}
    if isinstance(obj, Mapping):
        return {str(k): to_doc(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [to_doc(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def collect_reasons(obj: Any, prefix: str = "") -> list[dict[str, str]]:
    """Every `Reason` in a dataclass tree as `{"field": json.path, "reason": why}`, depth first."""
    out: list[dict[str, str]] = []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for r in getattr(obj, "reasons", ()) or ():
            out.append({"field": _join(prefix, r.field), "reason": r.why})
        for f in dataclasses.fields(obj):
            if f.name != "reasons":
                out.extend(collect_reasons(getattr(obj, f.name), _join(prefix, f.name)))
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            out.extend(collect_reasons(v, f"{prefix}[{i}]"))
    return out


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def gpu_of_cuda(gpus: Iterable[Any], cuda_index: int) -> Any | None:
    """The GPU record (anything with a `cuda_index`: the probe's or platform.json's) that torch
    calls `cuda:cuda_index`; None when no record has it. Driver order and CUDA order can differ
    (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), so a GPU is never looked up by its driver index."""
    return next((g for g in gpus if g.cuda_index == cuda_index), None)


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Linux cpulist format (`0-3,8-11`, `0`, empty) as sorted ids. Raises ValueError if malformed."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            ids.update(range(int(lo), int(hi) + 1))
        else:
            ids.add(int(part))
    return tuple(sorted(ids))


def mask_to_ids(words: Iterable[int], word_bits: int = 64) -> tuple[int, ...]:
    """A bitmask split into words, lowest word first (NVML affinity arrays), as set-bit ids."""
    ids = []
    for w, word in enumerate(words):
        word = int(word)
        for b in range(word_bits):
            if word >> b & 1:
                ids.append(w * word_bits + b)
    return tuple(ids)


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is missing or unreadable (sysfs files vanish and deny)."""
    try:
        return path.read_text()
    except OSError:
        return None


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
