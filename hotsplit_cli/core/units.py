"""How hotsplit writes quantities for people: percentages and byte sizes. One place, used by the
CLI's rendering and by library and runtime messages alike."""

from __future__ import annotations


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def gib(n_bytes: float | None, digits: int = 2) -> str:
    """Bytes in GiB, or in MiB / KiB when that is the more readable unit."""
    if n_bytes is None:
        return "-"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n_bytes) >= (1 << shift) or unit == "KiB":
            return f"{n_bytes / (1 << shift):.{digits}f} {unit}"
    return f"{n_bytes} B"
