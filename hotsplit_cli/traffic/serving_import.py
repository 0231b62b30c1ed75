"""Routing counts recorded by serving frameworks (SGLang, vLLM) -> `hotsplit.hist/1` (numpy; torch
only to read `.pt`). Not to be confused with runtime/engine.py, hotsplit's own step driver.

Shape letters: R = rows of the engine's file (model layers or MoE layers), E = logical experts,
P = physical experts (replicas), S = recorded steps (forward passes).

Forms read:

- SGLang, JSON `{"logical_count": [[...]]}` as read by `--init-expert-location`: [R, E] or
  [S, R, E], one row per *model* layer (dense layers' rows are all zero).
- SGLang expert-distribution recorder dumps (`/dump_expert_distribution_record`, `.pt`):
  * mode `stat`: `{"rank", "logical_count": int [S, R, E], "average_utilization_rate_over_window"}`;
  * modes `per_pass` / `per_token`: `{"records": [{"forward_pass_id", "rank", "gatherer_key",
    "global_physical_count": [R, P], ...}], "last_physical_to_logical_map": [R, P]}`, one file per
    rank (pass them all: they are summed).
- vLLM: its EPLB keeps the expert load only in memory (`EplbModelState.expert_load_window`
  [window, MoE layers, P] and `physical_to_logical_map` [MoE layers, P]) and writes no file.
  A `.pt` holding those two tensors under those names (saved with `torch.save` from the engine)
  is read; rows are MoE layers, not model layers.

A `.pt` is read with `torch.load(weights_only=True)`: tensors, numbers, strings, lists and dicts
only, never arbitrary pickled objects. Anything else is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.core.checks import check_finite_nonneg
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.core.jsonio import read_json
from hotsplit_cli.traffic.hist import Histogram

SERVERS = ("sglang", "vllm")


@dataclass(frozen=True)
class ServingCounts:
    """Counts as the engine's file lays them out, before mapping rows to MoE layer ids."""

    counts_RE: np.ndarray  # float64 [R, E], routed assignments per logical expert
    rows: str  # "model layers" (SGLang) | "MoE layers" (vLLM)
    form: str  # which file form was read, for the histogram's `source`
    steps: int | None  # forward passes recorded, when the file says


def _as_array(x: object, where: str, name: str) -> np.ndarray:
    """A tensor, ndarray or nested list of numbers -> float64 array; anything else is refused."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor (torch imported by the caller)
        x = x.detach().cpu().double().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputFileError(f"{where}: `{name}` is not a numeric array (ragged or non-numeric)") from None
    check_finite_nonneg(a, InputFileError, lambda idx, problem: f"{where}: `{name}{list(idx)}` is {problem}")
    return a


ReadPt = Callable[[Path], object]  # a tensors-only .pt reader (torch lives in the runtime package)


def _open(path: Path, read_pt: ReadPt | None) -> object:
    if not path.is_file():
        raise InputFileError(f"{path}: no such file", "check the path")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return read_json(path)
    if suffix in (".pt", ".pth"):
        if read_pt is None:
            raise InputFileError(f"{path}: reading .pt files needs torch", "install torch")
        return read_pt(path)
    raise InputFileError(f"{path}: unknown file type {suffix or '(none)'}",
                         "expected SGLang's .json (logical_count) or a recorder dump .pt")


def _logical_count(a: np.ndarray, where: str) -> tuple[np.ndarray, int | None]:
    if a.ndim == 3:
        return a.sum(axis=0), int(a.shape[0])
    if a.ndim == 2:
        return a, None
    raise InputFileError(f"{where}: `logical_count` must be [layers, experts] or [steps, layers, experts], "
                         f"got {a.ndim}-D {list(a.shape)}")


def _physical_to_logical(count_RP: np.ndarray, p2l_RP: np.ndarray, where: str) -> np.ndarray:
    if p2l_RP.shape != count_RP.shape:
        raise InputFileError(f"{where}: physical counts {list(count_RP.shape)} and physical_to_logical_map "
                             f"{list(p2l_RP.shape)} differ in shape")
    if np.any(p2l_RP != np.round(p2l_RP)):
        raise InputFileError(f"{where}: physical_to_logical_map holds non-integer expert ids")
    p2l = p2l_RP.astype(np.int64)
    E = int(p2l.max()) + 1
    R = count_RP.shape[0]
    out = np.zeros((R, E))
    np.add.at(out, (np.repeat(np.arange(R), p2l.shape[1]), p2l.ravel()), count_RP.ravel())
    return out


def read_sglang(paths: list[Path], read_pt: ReadPt | None = None) -> ServingCounts:
    """SGLang's JSON or recorder `.pt` dumps (several per-rank dumps are summed)."""
    total: np.ndarray | None = None
    forms, steps = [], 0
    for path in paths:
        doc = _open(path, read_pt)
        where = str(path)
        if not isinstance(doc, dict):
            raise InputFileError(f"{where}: expected a dict/object, got {type(doc).__name__}")
        if "logical_count" in doc:
            counts, s = _logical_count(_as_array(doc["logical_count"], where, "logical_count"), where)
            form = "logical_count" + (f" over {s} steps" if s else "")
            steps += s or 0
        elif "records" in doc:
            records = doc["records"]
            if not isinstance(records, list) or not records:
                raise InputFileError(f"{where}: `records` is empty", "did the recorder run while requests were served?")
            if "last_physical_to_logical_map" not in doc:
                raise InputFileError(f"{where}: per-pass dump without `last_physical_to_logical_map`")
            p2l = _as_array(doc["last_physical_to_logical_map"], where, "last_physical_to_logical_map")
            phys = None
            for i, rec in enumerate(records):
                if not isinstance(rec, dict) or "global_physical_count" not in rec:
                    raise InputFileError(f"{where}: `records[{i}]` has no `global_physical_count`")
                c = _as_array(rec["global_physical_count"], where, f"records[{i}].global_physical_count")
                if phys is not None and c.shape != phys.shape:
                    raise InputFileError(f"{where}: `records[{i}].global_physical_count` has shape "
                                         f"{list(c.shape)}, records[0] has {list(phys.shape)}")
                phys = c if phys is None else phys + c
            counts = _physical_to_logical(phys, p2l, where)
            mode = "per_token" if "topk_ids_of_layer" in records[0] else "per_pass"
            form = f"{mode} records ({len(records)} passes)"
            steps += len(records)
        else:
            keys = sorted(map(str, doc))[:8]
            raise InputFileError(f"{where}: no `logical_count` or `records` (keys: {keys})",
                                 "expected an SGLang expert-distribution dump or its logical_count JSON")
        if total is not None and counts.shape[0] != total.shape[0]:
            raise InputFileError(f"{where}: {counts.shape[0]} layers, but {paths[0]} has {total.shape[0]}")
        if total is not None and counts.shape[1] != total.shape[1]:
            # A physical->logical map may not mention the last experts in every file: pad.
            E = max(counts.shape[1], total.shape[1])
            counts = np.pad(counts, ((0, 0), (0, E - counts.shape[1])))
            total = np.pad(total, ((0, 0), (0, E - total.shape[1])))
        total = counts if total is None else total + counts
        forms.append(f"{path.name}: {form}")
    assert total is not None
    return ServingCounts(total, "model layers", "sglang " + "; ".join(forms), steps or None)


def read_vllm(paths: list[Path], read_pt: ReadPt | None = None) -> ServingCounts:
    """A `.pt` with vLLM's `expert_load_window` [W, L_moe, P] and `physical_to_logical_map` [L_moe, P]."""
    total, steps = None, 0
    for path in paths:
        if path.suffix.lower() not in (".pt", ".pth"):
            raise InputFileError(
                f"{path}: vLLM writes no expert-load file of its own",
                "save EplbModelState.expert_load_window and physical_to_logical_map with torch.save({...}) "
                "to a .pt and import that (see docs/real-models.md)",
            )
        doc = _open(path, read_pt)
        where = str(path)
        if not isinstance(doc, dict) or "expert_load_window" not in doc:
            raise InputFileError(f"{where}: no `expert_load_window` tensor",
                                 "save vLLM's EplbModelState.expert_load_window (and physical_to_logical_map)")
        load = _as_array(doc["expert_load_window"], where, "expert_load_window")
        if load.ndim == 3:
            steps += load.shape[0]
            load = load.sum(axis=0)
        elif load.ndim != 2:
            raise InputFileError(f"{where}: `expert_load_window` must be [window, layers, experts], "
                                 f"got {list(load.shape)}")
        if "physical_to_logical_map" in doc:
            load = _physical_to_logical(load, _as_array(doc["physical_to_logical_map"], where,
                                                        "physical_to_logical_map"), where)
        if total is not None and total.shape != load.shape:
            raise InputFileError(f"{where}: shape {list(load.shape)} differs from {paths[0]} {list(total.shape)}")
        total = load if total is None else total + load
    assert total is not None
    names = ", ".join(p.name for p in paths)
    return ServingCounts(total, "MoE layers", f"vllm expert_load_window ({names})", steps or None)


def read_serving(server: str, paths: list[str | os.PathLike], read_pt: ReadPt | None = None) -> ServingCounts:
    """What `server` (sglang | vllm) recorded in `paths`; `read_pt` reads `.pt` dumps (runtime.torch_files)."""
    if server not in SERVERS:
        raise UsageError(f"--from: must be one of {', '.join(SERVERS)}, got {server!r}")
    if not paths:
        raise UsageError("name at least one file to import")
    ps = [Path(p) for p in paths]
    return read_sglang(ps, read_pt) if server == "sglang" else read_vllm(ps, read_pt)


@dataclass(frozen=True)
class Imported:
    hist: Histogram
    notes: tuple[str, ...]  # how rows became layers, what was dropped


def _rows_by_recipe(counts: np.ndarray, m, top_k: int | None, where: str, notes: list[str]
                    ) -> tuple[np.ndarray, tuple[int, ...], int]:
    """Rows named by the recipe: all model layers (dense ones must be empty) or one per MoE layer."""
    R, E = counts.shape
    if top_k is not None and top_k != m.top_k:
        raise UsageError(f"--top-k {top_k} differs from the recipe's model.top_k {m.top_k}")
    top_k = m.top_k
    if E > m.num_experts:
        raise InputFileError(f"{where}: {E} experts per layer, but the recipe's model has {m.num_experts}",
                             "is this the right recipe?")
    if E < m.num_experts:  # the engine's map never mentioned the last experts: they saw nothing
        counts = np.pad(counts, ((0, 0), (0, m.num_experts - E)))
    if R == m.num_hidden_layers:
        moe = list(m.moe_layer_ids)
        dense = sorted(set(range(R)) - set(moe))
        busy = [i for i in dense if counts[i].any()]
        if busy:
            raise InputFileError(
                f"{where}: row {busy[0]} has routed counts but the recipe says layer {busy[0]} is dense",
                "is this the right recipe?")
        counts = counts[moe]
        layers = tuple(moe)
        notes.append(f"{R} rows are model layers; kept the recipe's {len(moe)} MoE layers"
                     + (f", dropped dense layers {dense}" if dense else ""))
    elif R == m.num_moe_layers:
        layers = tuple(m.moe_layer_ids)
        notes.append(f"{R} rows are MoE layers, named by the recipe's MoE layer ids")
    else:
        raise InputFileError(
            f"{where}: {R} rows, but the recipe's model has {m.num_hidden_layers} layers of which "
            f"{m.num_moe_layers} are MoE", "is this the right recipe?")
    return counts, layers, top_k


def _rows_by_engine(ec: ServingCounts, top_k: int | None, notes: list[str]) -> tuple[np.ndarray, tuple[int, ...]]:
    """Without a recipe: SGLang rows are model layer ids (all-zero rows dropped), vLLM rows 0.. in order."""
    counts = ec.counts_RE
    R = counts.shape[0]
    if top_k is None:
        raise UsageError("the file does not say top_k", "pass --top-k K or --recipe R")
    if ec.rows == "model layers":
        keep = np.flatnonzero(counts.any(axis=1))
        dropped = sorted(set(range(R)) - set(keep.tolist()))
        counts, layers = counts[keep], tuple(int(i) for i in keep)
        notes.append(f"rows are model layer ids; dropped all-zero rows {dropped} as dense layers"
                     if dropped else "rows are model layer ids; no all-zero rows")
        notes.append("pass --recipe to map rows to MoE layers exactly")
    else:
        layers = tuple(range(R))
        notes.append("rows are MoE layers in order, numbered 0..; pass --recipe for the model's layer ids")
    return counts, layers


def to_histogram(ec: ServingCounts, model_spec=None, top_k: int | None = None, model_name: str | None = None,
                 where: str = "import") -> Imported:
    """Map the engine's rows to MoE layer ids and build a histogram.

    With a recipe's `ModelSpec`: rows are model layers (all of them) or MoE layers (one each);
    the recipe's MoE layer ids name them, and counts on a dense layer are an error (wrong
    recipe). Without one: SGLang rows are model layer ids and all-zero rows are dropped as
    dense; vLLM rows are numbered 0.. in MoE-layer order.
    """
    counts = ec.counts_RE
    notes: list[str] = []
    if model_spec is not None:
        counts, layers, top_k = _rows_by_recipe(counts, model_spec, top_k, where, notes)
        name = model_name or model_spec.name
    else:
        counts, layers = _rows_by_engine(ec, top_k, notes)
        name = model_name or "unknown"
    if not counts.any():
        raise InputFileError(f"{where}: every count is zero", "the engine recorded no routed tokens")
    tokens = int(round(counts.sum(axis=1).max() / top_k))
    hist = Histogram(model=name, source=ec.form, top_k=int(top_k), tokens=tokens, layers=layers,
                     counts_LE=np.ascontiguousarray(counts, dtype=np.float64))
    return Imported(hist, tuple(notes))
