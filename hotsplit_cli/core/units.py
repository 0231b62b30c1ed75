"""How hotsplit writes quantities for people: percentages and byte sizes. One place, used by the
CLI's rendering and by library and runtime messages alike."""

from __future__ import annotations


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


UNITS = (("GiB", 30), ("MiB", 20), ("KiB", 10))


def gib(n_bytes: float | None, digits: int = 2, unit: str | None = None) -> str:
    """Bytes in GiB, or in MiB / KiB when that is the more readable unit; `unit` fixes the unit
    (a column of figures that must read alike)."""
    if n_bytes is None:
        return "-"
    if n_bytes == 0 and unit is None:
        return "0 B"
    for name, shift in UNITS:
        if name == unit or (unit is None and (abs(n_bytes) >= (1 << shift) or name == "KiB")):
            return f"{n_bytes / (1 << shift):.{digits}f} {name}"
    raise ValueError(f"unit must be one of {[u for u, _ in UNITS]}, got {unit!r}")


def size(n_bytes: int | None) -> str:
    """A buffer or page size: the largest unit it reaches, whole values without decimals
    (`64 MiB`, `1.50 MiB`, `512 B`)."""
    if n_bytes is None:
        return "-"
    for name, shift in UNITS:
        if n_bytes >= (1 << shift):
            v = n_bytes / (1 << shift)
            return f"{v:.0f} {name}" if v == int(v) else f"{v:.2f} {name}"
    return f"{n_bytes} B"


def duration(ms: float | None) -> str:
    """A time in ms, or in us below 1 ms, to 3 significant figures: a small value reads as what it
    is (`16.9 us`), never as `0.000 ms`; an exact zero is `0 ms`."""
    if ms is None:
        return "-"
    if ms == 0:
        return "0 ms"
    return f"{ms:.3g} ms" if abs(ms) >= 1 else f"{1e3 * ms:.3g} us"


def decimal_bytes(n_bytes: float | None) -> str:
    """Bytes on a link, in decimal units (1 MB = 1e6 B, as link rates are given in GB/s), to 3
    significant figures; an exact zero is `0 B`."""
    if n_bytes is None:
        return "-"
    for name, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.3g} {name}"
    return f"{n_bytes:.3g} B"
