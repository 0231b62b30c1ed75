"""`numastat` (numactl package) output, parsed in its plain, `-m` and `-n` (and compact `-c`) forms.

numastat prints junk such as `Token SwapCached not in hash table.` on stdout when the kernel
exports meminfo keys it does not know; those lines are skipped. The binary is optional: without
it the same numbers come from sysfs (`probes.sysfs`), and the report says so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

MIB = 1 << 20

_JUNK = re.compile(r"^Token .* not in hash table\.?$")
_NUMBER = re.compile(r"^-?[0-9]+(?:\.[0-9]+)?$")


@dataclass(frozen=True)
class NumastatCounters:
    """Plain `numastat`: allocation counters per node, in pages since boot."""

    nodes: tuple[int, ...]
    counters: dict[str, tuple[int, ...]]  # numa_hit -> (node0, node1, ...)

    def of_node(self, node: int) -> dict[str, int]:
        i = self.nodes.index(node)
        return {name: values[i] for name, values in self.counters.items()}


@dataclass(frozen=True)
class NumastatTable:
    """`numastat -m` (memory) or `-n` (counters) or their compact `-c` forms: MiB per node and total."""

    title: str  # "Per-node system memory usage (in MBs):"
    nodes: tuple[int, ...]
    rows: dict[str, tuple[float, ...]]  # per node, MiB (numastat's "MBs" are kB / 1024)
    totals: dict[str, float]
    skipped: tuple[str, ...]  # junk lines that were dropped

    def bytes_of(self, row: str, node: int) -> int | None:
        values = self.rows.get(row)
        if values is None or node not in self.nodes:
            return None
        return int(round(values[self.nodes.index(node)] * MIB))


def parse_numastat(text: str) -> NumastatCounters:
    """Plain `numastat` output. Wide machines print the nodes in several column groups, each
    starting with its own `node0 node1 ...` header; groups are merged. Raises ValueError."""
    nodes: list[int] = []
    counters: dict[str, list[int]] = {}
    group: list[int] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or _JUNK.match(line.strip()):
            continue
        if all(re.fullmatch(r"node\d+", p) for p in parts):
            group = [int(p[4:]) for p in parts]
            nodes.extend(n for n in group if n not in nodes)
            continue
        if not group:
            raise ValueError(f"numastat: row before any node header: {line.strip()!r}")
        name, values = parts[0], parts[1:]
        if len(values) != len(group) or not all(v.isdigit() for v in values):
            raise ValueError(f"numastat: expected {len(group)} counts in {line.strip()!r}")
        counters.setdefault(name, []).extend(int(v) for v in values)
    if not nodes:
        raise ValueError("numastat: no node header found")
    for name, row in counters.items():
        if len(row) != len(nodes):
            raise ValueError(f"numastat: {name} has {len(row)} values for {len(nodes)} nodes")
    return NumastatCounters(tuple(nodes), {k: tuple(v) for k, v in counters.items()})


def parse_numastat_table(text: str) -> NumastatTable:
    """`numastat -m`, `-n`, `-c`, `-cm` output (a `Node 0 Node 1 Total` table). Raises ValueError."""
    title = ""
    nodes: list[int] = []
    group: list[int] | None = None
    has_total = False
    rows: dict[str, list[float]] = {}
    totals: dict[str, float] = {}
    skipped: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _JUNK.match(line):
            skipped.append(line)
            continue
        if line.startswith("Per-node"):
            title = line
            continue
        if set(line) <= set("- "):
            continue
        if line.startswith("Node "):
            group = [int(n) for n in re.findall(r"Node\s+(\d+)", line)]
            has_total = line.endswith("Total")
            nodes.extend(n for n in group if n not in nodes)
            continue
        if group is None:
            raise ValueError(f"numastat: row before the Node header: {line!r}")
        parts = line.split()
        name, values = parts[0], parts[1:]
        want = len(group) + (1 if has_total else 0)
        if len(values) != want or not all(_NUMBER.match(v) for v in values):
            raise ValueError(f"numastat: expected {want} numbers in {line!r}")
        rows.setdefault(name, []).extend(float(v) for v in values[: len(group)])
        if has_total:
            totals[name] = float(values[-1])
    if not nodes:
        raise ValueError("numastat: no Node header found")
    for name, row in rows.items():
        if len(row) != len(nodes):
            raise ValueError(f"numastat: {name} has {len(row)} values for {len(nodes)} nodes")
    return NumastatTable(title, tuple(nodes), {k: tuple(v) for k, v in rows.items()}, totals, tuple(skipped))


@dataclass(frozen=True)
class ToolOutput:
    """A tool's stdout, or why there is none."""

    text: str | None
    reason: str | None


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)


def run_numastat(args: tuple[str, ...] = (), which: Callable[[str], str | None] = shutil.which,
                 run: Runner = _run) -> ToolOutput:
    """Run `numastat ARGS`; a missing binary, a timeout or a failure becomes a reason."""
    exe = which("numastat")
    if exe is None:
        return ToolOutput(None, "numastat not found on PATH (install the numactl package)")
    try:
        proc = run([exe, *args])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ToolOutput(None, f"numastat {' '.join(args)} failed: {exc}")
    if proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()
        return ToolOutput(None, f"numastat {' '.join(args)} exited {proc.returncode}: {err[-1] if err else ''}")
    return ToolOutput(proc.stdout, None)
