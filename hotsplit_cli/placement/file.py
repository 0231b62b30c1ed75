"""The files of an expert-parallel layout: hotsplit's own `hotsplit.placement/1` document (the
three maps, with how it was fitted) and SGLang's `--init-expert-location` map.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.core.errors import InputFileError, PlanError
from hotsplit_cli.core.holdout import Band
from hotsplit_cli.core.jsonio import read_json_doc, schema_tag, write_json_atomic
from hotsplit_cli.placement.algorithm import Placement
from hotsplit_cli.placement.evaluate import Balance
from hotsplit_cli.placement.held_out import band_of_doc

KIND = "placement"


def placement_doc(placement: Placement, num_experts: int, fitted: Balance | None = None,
                  source: dict | None = None, out_of_sample: dict | None = None) -> dict:
    """The native `hotsplit.placement/1` document; `out_of_sample`: held_out.HeldOutBalance's
    document (absent from older files, which still read)."""
    doc = {
        "schema": schema_tag(KIND),
        "method": placement.method,
        "layers": list(placement.layers),
        "num_experts": int(num_experts),
        "num_ranks": placement.num_ranks,
        "num_nodes": placement.num_nodes,
        "num_physical": placement.num_physical,
        "slots_per_rank": placement.slots_per_rank,
        "phy2log": placement.phy2log_LP,
        "log2phy": placement.log2phy_LEX(num_experts),
        "logcnt": placement.logcnt_LE(num_experts),
    }
    if fitted is not None:
        doc["fitted"] = fitted.to_doc()
    if source is not None:
        doc["source"] = source
    if out_of_sample is not None:
        doc["out_of_sample"] = out_of_sample
    return doc


def sglang_doc(placement: Placement, num_hidden_layers: int, num_experts: int) -> dict:
    """SGLang `--init-expert-location` JSON: one row per model layer; layers without a placed
    MoE row (dense layers, or MoE layers absent from the histogram) get the trivial row."""
    P = placement.num_physical
    rows = np.broadcast_to(np.arange(P) % num_experts, (num_hidden_layers, P)).copy()
    for i, layer in enumerate(placement.layers):
        if not 0 <= layer < num_hidden_layers:
            raise PlanError(f"placement layer {layer} is outside the model's {num_hidden_layers} layers")
        rows[layer] = placement.phy2log_LP[i]
    return {"physical_to_logical_map": rows}


def save_placement(path: str | os.PathLike, doc: dict) -> Path:
    return write_json_atomic(path, doc)


@dataclass(frozen=True)
class PlacementPrediction:
    """What a placement file predicts a run's balancedness to be, on windows of its histogram's size."""

    fitted: float | None  # in-sample balancedness (None: the file records none)
    steps_per_window: int | None  # engine steps per window of the histogram fitted on (None: not recorded)
    windows: int  # windows of that histogram
    out_of_sample: Band | None  # the held-out band (None: older file, or too few windows)
    balance: str  # tokens | time: which layout `place` wrote

    def window_steps(self, run_steps: int) -> int | None:
        """Steps per window a run is judged over: the histogram's; a histogram without windows is
        one window, as the whole run is. None: an older file that did not record its window size."""
        if self.steps_per_window:
            return self.steps_per_window
        return max(run_steps, 1) if self.windows <= 1 else None


def placement_prediction(path: str | os.PathLike, doc: dict | None = None) -> PlacementPrediction:
    """The predictions recorded in a `hotsplit.placement/1` file (`doc`: its document, when read
    already); InputFileError naming the file when they are malformed."""
    doc = read_json_doc(path, KIND) if doc is None else doc
    try:
        src = doc.get("source") or {}
        fitted = (doc.get("fitted") or {}).get("balancedness")
        spw = src.get("steps_per_window")
        pred = PlacementPrediction(None if fitted is None else float(fitted), int(spw) if spw else None,
                                   int(src.get("windows", 1)), band_of_doc(doc.get("out_of_sample")),
                                   str(src.get("balance", "tokens")))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InputFileError(f"{path}: malformed prediction in `fitted`, `source` or `out_of_sample` ({exc!r})",
                             "re-create it with `hotsplit place`") from None
    figures = [pred.fitted] + ([] if pred.out_of_sample is None else list(pred.out_of_sample.to_doc().values()))
    if not all(x is None or 0.0 <= x <= 1.0 for x in figures):
        raise InputFileError(f"{path}: a predicted balancedness outside [0, 1] in `fitted` or `out_of_sample`",
                             "re-create it with `hotsplit place`")
    return pred


def load_placement(path: str | os.PathLike) -> Placement:
    """Read a `hotsplit.placement/1` file and check every invariant of the maps."""
    doc = read_json_doc(path, KIND)
    try:
        layers = tuple(int(x) for x in doc["layers"])
        num_ranks = int(doc["num_ranks"])
        num_experts = int(doc["num_experts"])
        phy = np.asarray(doc["phy2log"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputFileError(f"{path}: malformed placement ({exc!r})", "re-create it with `hotsplit place`") from None
    if phy.ndim != 2 or phy.shape[0] != len(layers) or not np.issubdtype(phy.dtype, np.integer):
        raise InputFileError(f"{path}: `phy2log` must be int [{len(layers)}][physical experts], "
                             f"got {phy.dtype} {list(phy.shape)}")
    if num_ranks < 1 or phy.shape[1] % num_ranks:
        raise InputFileError(f"{path}: `num_ranks` {num_ranks} does not divide {phy.shape[1]} physical experts")
    if phy.min() < 0 or phy.max() >= num_experts:
        raise InputFileError(f"{path}: `phy2log` names expert ids outside [0, {num_experts})")
    placement_prediction(path, doc)  # its predictions too, before any work relies on the file
    placement = Placement(layers, num_ranks, phy.astype(np.int64), str(doc.get("method", "hotsplit")),
                          int(doc.get("num_nodes", 1)))
    missing = np.argwhere(placement.logcnt_LE(num_experts) == 0)
    if len(missing):
        layer_row, e = missing[0]
        raise InputFileError(f"{path}: layer {layers[layer_row]} has no replica of expert {e}")
    return placement
