"""nvidia-smi: the fallback for memory and link fields when NVML is unusable from Python.

`--query-gpu=... --format=csv,noheader,nounits` fails as a whole when one field is unknown to
the installed driver, so the basic fields go in one query and each extended field is queried
on its own (with `index` so rows line up). Values such as `[N/A]` or `[Not Supported]` become
None with the text as the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .common import DriverReport, GpuDevice, Reason

MIB = 1 << 20

BASIC_FIELDS = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "memory.used",
                "memory.free")
# field -> GpuDevice attribute; memory fields are MiB with `nounits`.
EXTENDED_FIELDS = {
    "memory.reserved": "mem_reserved_bytes",
    "pcie.link.gen.current": "pcie_gen_current",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.gen.gpumax": "pcie_gen_gpu_max",
    "pcie.link.width.current": "pcie_width_current",
    "pcie.link.width.max": "pcie_width_max",
}


@dataclass(frozen=True)
class SmiValue:
    """One cell: the text, or None with why (`[N/A]`, `[Not Supported]`, field unknown)."""

    text: str | None
    reason: str | None = None


def parse_cell(cell: str) -> SmiValue:
    cell = cell.strip()
    if not cell or cell in ("N/A", "[N/A]") or (cell.startswith("[") and cell.endswith("]")):
        return SmiValue(None, f"nvidia-smi reports {cell or 'nothing'}")
    return SmiValue(cell)


def parse_query_csv(text: str, fields: Sequence[str]) -> list[dict[str, SmiValue]]:
    """`--format=csv,noheader,nounits` output, one dict per GPU row. Raises ValueError when a row
    has the wrong number of cells (GPU names never contain ", ")."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(fields):
            raise ValueError(f"nvidia-smi: expected {len(fields)} values, got {len(cells)} in {line.strip()!r}")
        rows.append({f: parse_cell(c) for f, c in zip(fields, cells, strict=True)})
    return rows


def _int(v: SmiValue) -> int | None:
    try:
        return int(float(v.text)) if v.text is not None else None
    except ValueError:
        return None


def _value(reasons: list[Reason], v: SmiValue, attr: str, scale: int = 1) -> int | None:
    n = _int(v)
    if n is None:
        reasons.append(Reason(attr, v.reason or f"nvidia-smi reports {v.text!r}"))
        return None
    return n * scale


def _text_of(reasons: list[Reason], v: SmiValue, attr: str) -> str | None:
    if v.text is None:
        reasons.append(Reason(attr, v.reason or "empty"))
    return v.text


def gpus_from_queries(basic_text: str, extended: dict[str, str | None]) -> tuple[tuple[GpuDevice, ...], str | None]:
    """Build GpuDevices from the basic query text and each extended field's own query text
    (None when that query failed). Pure: tested on captured text."""
    basic = parse_query_csv(basic_text, BASIC_FIELDS)
    ext_by_field: dict[str, dict[int, SmiValue]] = {}
    for field, text in extended.items():
        if text is None:
            continue
        try:
            ext_by_field[field] = {_int(r["index"]): r[field] for r in parse_query_csv(text, ("index", field))}
        except ValueError:
            continue  # a malformed answer counts as no answer: the field gets a reason below
    gpus = []
    driver = None
    for row in basic:
        index = _int(row["index"])
        if index is None:
            continue
        reasons: list[Reason] = []
        driver = driver or row["driver_version"].text

        fields: dict[str, int | None] = {}
        for field, attr in EXTENDED_FIELDS.items():
            if field not in ext_by_field:
                fields[attr] = None
                reasons.append(Reason(attr, f"nvidia-smi cannot query {field} (unknown to this driver or failed)"))
            elif index not in ext_by_field[field]:
                fields[attr] = None
                reasons.append(Reason(attr, f"nvidia-smi returned no {field} for GPU {index}"))
            else:
                scale = MIB if field.startswith("memory.") else 1
                fields[attr] = _value(reasons, ext_by_field[field][index], attr, scale)
        gpus.append(GpuDevice(
            index=index,
            name=_text_of(reasons, row["name"], "name"),
            uuid=_text_of(reasons, row["uuid"], "uuid"),
            pci_bus_id=_text_of(reasons, row["pci.bus_id"], "pci_bus_id"),
            mem_total_bytes=_value(reasons, row["memory.total"], "mem_total_bytes", MIB),
            mem_used_bytes=_value(reasons, row["memory.used"], "mem_used_bytes", MIB),
            mem_free_bytes=_value(reasons, row["memory.free"], "mem_free_bytes", MIB),
            numa_node=None, cpu_affinity=None, memory_affinity=None, source="nvidia-smi",
            reasons=(*reasons, *(Reason(a, "nvidia-smi does not report it") for a in
                                 ("numa_node", "cpu_affinity", "memory_affinity"))),
            **fields,
        ))
    return tuple(gpus), driver


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)


def _query(exe: str, fields: Sequence[str], run: Runner) -> tuple[str | None, str | None]:
    argv = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        proc = run(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed: {exc}"
    if proc.returncode != 0:
        msg = ((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()
        return None, f"nvidia-smi exited {proc.returncode}: {msg[-1] if msg else 'no message'}"
    return proc.stdout, None


def probe_nvidia_smi(which: Callable[[str], str | None] = shutil.which, run: Runner = _run) -> DriverReport:
    """Every GPU nvidia-smi lists, with the fields this driver's nvidia-smi knows."""
    exe = which("nvidia-smi")
    if exe is None:
        return DriverReport("nvidia-smi", False, None, (), "nvidia-smi not found on PATH")
    basic, why = _query(exe, BASIC_FIELDS, run)
    if basic is None:
        return DriverReport("nvidia-smi", False, None, (), why)
    extended = {field: _query(exe, ("index", field), run)[0] for field in EXTENDED_FIELDS}
    try:
        gpus, driver = gpus_from_queries(basic, extended)
    except ValueError as exc:
        return DriverReport("nvidia-smi", False, None, (), str(exc))
    return DriverReport("nvidia-smi", bool(gpus), driver, gpus, None if gpus else "nvidia-smi lists no GPU")
