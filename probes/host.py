"""The host: CPU model and cores (psutil, /proc/cpuinfo) and RAM total/available (psutil).

psutil reads /proc/meminfo on Linux, so `mem_total_bytes` equals MemTotal and
`mem_available_bytes` equals MemAvailable at the moment of reading.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import Reason, read_text


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    kernel: str
    machine: str  # x86_64, aarch64
    cpu_model: str | None
    cpu_sockets: int | None
    cpu_cores_physical: int | None
    cpu_cores_logical: int | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    reasons: tuple[Reason, ...] = ()


def parse_cpu_model(cpuinfo: str) -> str | None:
    """The CPU model from /proc/cpuinfo: `model name` (x86), else `Model`/`Hardware` (Arm boards)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "model", "hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return None


def count_sockets(cpuinfo: str) -> int | None:
    ids = {line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("physical id")}
    return len(ids) or None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as {"MemTotal": bytes, ...} (kB entries scaled; counts kept)."""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    return out


def _psutil() -> Any:
    import psutil

    return psutil


def probe_host(root: str | Path = "/", load_psutil=_psutil) -> HostInfo:
    """CPU and RAM of this machine. Without psutil, RAM comes from /proc/meminfo directly."""
    reasons: list[Reason] = []
    cpuinfo = read_text(Path(root) / "proc/cpuinfo") or ""
    model = parse_cpu_model(cpuinfo) or platform.processor() or None
    if model is None:
        reasons.append(Reason("cpu_model", "/proc/cpuinfo has no model name"))
    sockets = count_sockets(cpuinfo)
    if sockets is None:
        reasons.append(Reason("cpu_sockets", "/proc/cpuinfo has no physical id"))
    physical = logical = total = available = None
    try:
        psutil = load_psutil()
        physical = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True)
        vm = psutil.virtual_memory()
        total, available = int(vm.total), int(vm.available)
    except ImportError:
        reasons.append(Reason("cpu_cores_physical", "psutil is not installed"))
        logical = os.cpu_count()
        mem = parse_meminfo(read_text(Path(root) / "proc/meminfo") or "")
        total, available = mem.get("MemTotal"), mem.get("MemAvailable")
    if physical is None and not any(r.field == "cpu_cores_physical" for r in reasons):
        reasons.append(Reason("cpu_cores_physical", "psutil cannot tell physical cores on this system"))
    for field, value in (("mem_total_bytes", total), ("mem_available_bytes", available)):
        if value is None:
            reasons.append(Reason(field, "neither psutil nor /proc/meminfo reports it"))
    uname = platform.uname()
    return HostInfo(socket.gethostname(), uname.release, uname.machine, model, sockets, physical, logical,
                    total, available, tuple(reasons))
