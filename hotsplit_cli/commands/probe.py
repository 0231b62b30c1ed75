"""`hotsplit probe [--json] [-o platform.json] [--quick|--full] [--recipe R]`: what this machine really does.

Reads host, NUMA nodes, GPUs and links, times host<->GPU copies and GPU zero-copy reads of
pinned host memory per NUMA node (host memory copies on a machine without CUDA), and with a
recipe derives the hot budget per GPU from its measured free memory. The probes live in
`probes/` and are imported when the command runs, so `hotsplit --help` stays instant.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from hotsplit_probes.cpu_expert import ExpertShape
from hotsplit_probes.platform import Sources, measure_platform, take_inventory

from hotsplit_cli import __version__
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import GIB, Recipe, load_recipe
from hotsplit_cli.core.errors import PlanError, UsageError
from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.core.units import size
from hotsplit_cli.hotset.sizes import (
    dense_bytes_per_rank,
    derive_hot_budget,
    expert_bytes_per_rank,
    expert_compute_shape,
    scaled_dim,
)
from hotsplit_cli.options import JsonOpt, OutOpt, RecipeOpt
from hotsplit_cli.output import Output, gib

QuickOpt = Annotated[bool, typer.Option("--quick", help="A short sweep in seconds (the default).")]
FullOpt = Annotated[bool, typer.Option("--full", help="Sweep 64 KiB..1 GiB with 10 samples per size (minutes).")]


def id_ranges(ids: Sequence[int] | None) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8"."""
    if not ids:
        return "-"
    ids = sorted(ids)
    parts, start, prev = [], ids[0], ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _gbps(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def hot_budgets(doc: dict[str, Any], rec: Recipe, reserve_gib: float) -> None:
    """Add `hot_budget` (every term in GiB) to each GPU of the platform document, in place."""
    for i, g in enumerate(doc["gpus"]):
        free = g.get("mem_free_bytes")
        if free is None:
            g["hot_budget"] = None
            doc["reasons"].append({"field": f"gpus[{i}].hot_budget", "reason": "free GPU memory unknown"})
            continue
        try:
            d = derive_hot_budget(rec, reserve_gib, free / GIB, f"free memory of GPU {g['index']}")
        except PlanError as exc:
            g["hot_budget"] = None
            doc["reasons"].append({"field": f"gpus[{i}].hot_budget", "reason": exc.message})
            continue
        g["hot_budget"] = {**d.to_doc(), "explain": d.explain()}
    if not doc["gpus"]:
        doc["reasons"].append({"field": "gpus[*].hot_budget", "reason": "no GPU: the hot budget needs GPU memory"})


def _render(out: Output, doc: dict[str, Any]) -> None:
    host = doc["host"]
    out.print(f"host {host['hostname']}: {host['cpu_model'] or 'unknown CPU'}, {host['cpu_sockets'] or '?'} socket(s), "
              f"{host['cpu_cores_physical'] or '?'} cores / {host['cpu_cores_logical'] or '?'} threads, "
              f"RAM {gib(host['mem_total_bytes'])} total, {gib(host['mem_available_bytes'])} available")
    t = out.table("node", "CPUs", "memory", "free", "distances", "hugepages free/total", "remote allocs",
                  title=f"NUMA nodes (from {host['numa_source']})")
    for n in host["numa_nodes"]:
        huge = " ".join(f"{size(h['size_kib'] * 1024).replace(' ', '')}:{h['free']}/{h['total']}"
                        for h in n["hugepages"] if h["total"]) or "none"
        stat = n["numastat"] or {}
        hit, miss = stat.get("numa_hit"), stat.get("numa_miss")
        remote = "-" if hit is None or miss is None or hit + miss == 0 else f"{100 * miss / (hit + miss):.2f}%"
        t.add_row(str(n["node"]), id_ranges(n["cpus"]), gib(n["mem_total_bytes"], 1), gib(n["mem_free_bytes"], 1),
                  " ".join(map(str, n["distances"] or [])) or "-", huge, remote)
    out.print(t)
    if host["numa_nodes"]:
        out.print("node free: pages nobody uses (MemFree); host available: free pages plus page cache and other "
                  "memory the kernel can reclaim (MemAvailable), so it is usually larger")
    if host["copy"]:
        t = out.table("size", *(f"from node {c['node']}" if c["node"] is not None else "unbound"
                                for c in host["copy"]), title="host memory copy, GB/s (median)")
        for j, m in enumerate(host["copy"][0]["copy"]):
            t.add_row(size(m["size_bytes"]), *(_gbps(c["copy"][j]["median_gbps"]) for c in host["copy"]))
        out.print(t)
    if host.get("cpu_expert"):
        _render_cpu_expert(out, host["cpu_expert"])
    if not doc["gpus"]:
        why = next((r["reason"] for r in doc["reasons"] if r["field"] == "gpus"), "none found")
        out.print(f"GPUs: none ({why})")
    else:
        _render_gpus(out, doc)
    if doc.get("recipe"):
        _render_budget(out, doc)
    if doc["reasons"]:
        t = out.table("not measured / fallback", "why")
        for r in doc["reasons"]:
            t.add_row(r["field"], r["reason"])
        out.print(t)


def _render_cpu_expert(out: Output, rates: list[dict[str, Any]]) -> None:
    shape = rates[0]["shape"]
    t = out.table("tokens per expert", *(f"node {r['node']} ({r['threads']} threads)" if r["node"] is not None
                                         else f"unbound ({r['threads']} threads)" for r in rates),
                  title=f"CPU expert rate, GB/s of weights (SwiGLU {shape['hidden']}x{shape['inter']} "
                        f"{shape['dtype']}, {size(rates[0]['expert_bytes'])} per expert)")
    for j, (tokens, _) in enumerate(rates[0]["by_tokens"]):
        t.add_row(str(tokens), *(_gbps(r["by_tokens"][j][1]["median_gbps"]) for r in rates))
    if any(r.get("layer_ms") is not None for r in rates):
        t.add_row(f"a layer's call, beyond its experts ({rates[0]['layer_experts']} per layer)",
                  *("-" if r.get("layer_ms") is None else f"{r['layer_ms']:.3f} ms" for r in rates))
    out.print(t)


def _render_gpus(out: Output, doc: dict[str, Any]) -> None:
    t = out.table("GPU", "name", "PCI bus", "NUMA", "total", "free", "reserved", title="GPU memory")
    for g in doc["gpus"]:
        t.add_row(str(g["index"]), g["name"] or "-", g["pci_bus_id"] or "-",
                  "-" if g["numa_node"] is None else str(g["numa_node"]), gib(g["mem_total_bytes"], 1),
                  gib(g["mem_free_bytes"], 1), gib(g["mem_reserved_bytes"], 1))
    out.print(t)

    def gw(gen: int | None, width: int | None) -> str:
        return "-" if gen is None and width is None else f"Gen{gen or '?'} x{width or '?'}"

    t = out.table("GPU", "idle", "under load", "max (GPU+slot)", "GPU max", "link GB/s", "verdict", title="PCIe links")
    for g in doc["gpus"]:
        t.add_row(str(g["index"]), gw(g["pcie_gen_current"], g["pcie_width_current"]),
                  gw(g["pcie_gen_under_load"], g["pcie_width_under_load"]), gw(g["pcie_gen_max"], g["pcie_width_max"]),
                  "-" if g["pcie_gen_gpu_max"] is None else f"Gen{g['pcie_gen_gpu_max']}", _gbps(g["link_rate_gbps"]),
                  g["link_verdict"])
    out.print(t)
    for g in doc["gpus"]:
        if g["link_verdict"] != "ok" and g["link_detail"]:
            out.print(f"GPU {g['index']} link {g['link_verdict']}: {g['link_detail']}")
    nodes = sorted({n["node"] for g in doc["gpus"] if g["bandwidth"] for n in g["bandwidth"]["by_node"]},
                   key=lambda x: -1 if x is None else x)
    if not nodes:
        return
    for kind, label in (("zero_copy_read", "zero-copy read"), ("h2d", "host->device copy"),
                        ("d2h", "device->host copy")):
        t = out.table("GPU", *(f"node {n}" if n is not None else "unbound" for n in nodes),
                      title=f"{label}, GB/s at the largest size (* = the GPU's own node)")
        for g in doc["gpus"]:
            cells = []
            by_node = {n["node"]: n for n in (g["bandwidth"] or {}).get("by_node", [])}
            for n in nodes:
                entry = by_node.get(n)
                sweep = entry[kind] if entry else None
                mark = "*" if entry and entry["local"] else ""
                cells.append(_gbps(sweep[-1]["median_gbps"]) + mark if sweep else "-")
            t.add_row(str(g["index"]), *cells)
        out.print(t)
    for g in doc["gpus"]:
        s = g["summary"]
        entry = next((n for n in (g["bandwidth"] or {}).get("by_node", []) if n["node"] == s["node"]), None)
        if not entry or not entry["h2d"]:
            continue
        t = out.table("size", "h2d GB/s", "d2h GB/s", "zero-copy GB/s", "zero-copy % link", "spread",
                      title=f"GPU {g['index']} size sweep, host buffer on node {s['node']}")
        zc = {m["size_bytes"]: m for m in entry["zero_copy_read"] or []}
        for h, d in zip(entry["h2d"], entry["d2h"], strict=True):
            z = zc.get(h["size_bytes"])
            t.add_row(size(h["size_bytes"]), _gbps(h["median_gbps"]), _gbps(d["median_gbps"]),
                      _gbps(z["median_gbps"] if z else None),
                      "-" if not z or z["pct_of_link"] is None else f"{100 * z['pct_of_link']:.0f}%",
                      f"±{(z or h)['spread_gbps'] / 2:.1f}")
        out.print(t)
    _render_gpu_compute(out, doc["gpus"])


def _render_gpu_compute(out: Output, gpus: list[dict[str, Any]]) -> None:
    """Each GPU's compute rate through resident weights (prefetch's room to hide copies)."""
    measured = [g for g in gpus if g.get("compute")]
    if not measured:
        return
    c = measured[0]["compute"]
    t = out.table("tokens", *(f"GPU {g['index']}" for g in measured),
                  title=f"GPU compute through resident weights, GB/s ({size(c['weight_bytes'])} {c['dtype']} matrix)")
    for j, (tokens, _) in enumerate(c["by_tokens"]):
        t.add_row(str(tokens), *(_gbps(g["compute"]["by_tokens"][j][1]["median_gbps"]) for g in measured))
    out.print(t)


def _render_budget(out: Output, doc: dict[str, Any]) -> None:
    r = doc["recipe"]
    out.print(f"recipe {r['name']}: one expert {size(r['expert_bytes'])} per rank, dense weights "
              f"{gib(r['dense_bytes_per_rank'])} per rank, reserve {r['vram_reserve_gib']:.2f} GiB "
              f"({r['vram_reserve_source']})")
    if not doc["gpus"]:
        out.print("hot budget: no GPU on this machine")
        return
    t = out.table("GPU", "free", "- dense", "- KV cache", "- reserve", "= hot budget", "experts", title="hot budget")
    for i, g in enumerate(doc["gpus"]):
        b = g.get("hot_budget")
        if b is None:
            why = next((x["reason"] for x in doc["reasons"] if x["field"] == f"gpus[{i}].hot_budget"), "unknown")
            t.add_row(str(g["index"]), gib(g["mem_free_bytes"]), "-", "-", "-", f"none: {why}", "-")
            continue
        experts = int(b["hot_gib"] * GIB // r["expert_bytes"])
        capped = " (full bank)" if b["hot_gib"] >= b["bank_gib"] else ""
        t.add_row(str(g["index"]), f"{b['gpu_mem_gib']:.2f} GiB", f"{b['dense_gib']:.2f}", f"{b['kv_cache_gib']:.2f}",
                  f"{b['reserve_gib']:.2f}", f"{gib(b['hot_gib'] * GIB)}{capped}", str(experts))
    out.print(t)


def scaled_shape(shape: tuple[int, int, str], scale: float | None) -> tuple[int, int, str]:
    """(hidden, inter, dtype) as `run --scale` allocates them (hotset/sizes.py scaled_dim)."""
    if scale is None or scale >= 1:
        return shape
    return scaled_dim(shape[0], scale), scaled_dim(shape[1], scale), shape[2]


def _sources() -> Any:
    """Where the probes read from (tests replace this with scenario fakes)."""
    return Sources()


def probe_cmd(
    json: JsonOpt = False,
    output: OutOpt = None,
    quick: QuickOpt = False,
    full: FullOpt = False,
    recipe: RecipeOpt = None,
    scale: Annotated[float | None, typer.Option(
        "--scale", show_default="none: the recipe's full size",
            help="With --recipe: time the CPU expert rate on the experts `run --scale S` allocates.")] = None,
) -> None:
    """Measure this machine (PCIe, zero-copy reads, NUMA, GPU memory) and write platform.json."""
    out = Output(json)
    if quick and full:
        raise UsageError("--quick and --full exclude each other", "pick one (quick is the default)")
    if scale is not None and (recipe is None or not 0 < scale <= 1):
        raise UsageError(f"--scale: must be in (0, 1] with --recipe, got {scale}", "pass --recipe R --scale S")
    rec, knobs = None, None
    if recipe is not None:
        rec = load_recipe(recipe)
        knobs = resolve_knobs(rec.knobs, os.environ)

    sources = _sources()
    shape = ExpertShape(*scaled_shape(expert_compute_shape(rec), scale)) if rec else None
    inv = take_inventory("full" if full else "quick", expert_bytes_per_rank(rec) if rec else None, sources, shape,
                         rec.model.num_experts if rec else None)
    with out.progress("measuring bandwidth", inv.measurement_steps) as advance:
        platform = measure_platform(inv, sources, tick=advance)
    doc = platform.to_doc()
    doc = {"schema": doc.pop("schema"), "created": doc.pop("created"), "hotsplit_version": __version__, **doc}
    if rec is not None and knobs is not None:
        doc["recipe"] = {"name": rec.name, "expert_bytes": expert_bytes_per_rank(rec),
                         "dense_bytes_per_rank": dense_bytes_per_rank(rec),
                         "kv_cache_gib": rec.hardware.kv_cache_gib, "vram_reserve_gib": knobs.vram_reserve_gib,
                         "vram_reserve_source": knobs.sources["vram_reserve_gib"]}
        hot_budgets(doc, rec, knobs.vram_reserve_gib)
        doc["reasons"] = doc.pop("reasons")  # keep reasons last
    if output is not None:
        write_json_atomic(output, doc)
    out.emit(doc, lambda: _render(out, doc))
    if output is not None:
        out.note(f"wrote {output}")
    elif not json:
        out.note("write it for `hotsplit plan --platform` with: hotsplit probe -o platform.json")


def register(app: typer.Typer, hist_app: typer.Typer) -> None:
    app.command("probe")(probe_cmd)
