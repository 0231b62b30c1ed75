"""How many parameters a checkpoint has, from the best source present: the safetensors headers
(exact), else the index's `metadata.total_size` (bytes, exact for an unquantised checkpoint of
one dtype), else computed from config.json's geometry (approximate). Pure JSON and struct.

A safetensors file opens with an 8-byte little-endian header length, then that many bytes of
JSON: `{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}`.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.config.checkpoint import CheckpointGeometry, quant_method
from hotsplit_cli.core.errors import InputFileError

_HEADER_LIMIT = 100 << 20  # a header larger than this is not a safetensors file
_LAYER = re.compile(r"layers\.(\d+)\.")


@dataclass(frozen=True)
class ParamCount:
    """A checkpoint's parameter count and where it came from."""

    total_params: float
    active_params: float
    source: str  # for people: `safetensors headers (3 files)`, `computed from ...`
    exact: bool  # from the headers (or an unquantised index), not computed from the geometry


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of one safetensors file (the tensors' dtypes and shapes, no data)."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _HEADER_LIMIT:
                raise ValueError(f"header length {n}")
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: not a safetensors file ({exc})", "is the download complete?") from None
    if not isinstance(header, dict):
        raise InputFileError(f"{path}: not a safetensors file (header is not an object)")
    return header


def tensor_params(name: str, entry: dict, names: set[str]) -> int:
    """Parameters one header entry holds: fp8 `_scale_inv` and mxfp4 `_scales` are storage, not
    parameters; mxfp4 `_blocks` hold two 4-bit values per byte."""
    if name.endswith("_scale_inv") or (name.endswith("_scales") and name[:-len("_scales")] + "_blocks" in names):
        return 0
    n = math.prod(entry.get("shape", []))
    return 2 * n if name.endswith("_blocks") else n


def _weight_files(folder: Path) -> list[Path] | None:
    """Every weight file, when all of them are present; None when any is missing."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_index(index).get("weight_map", {}).values()))
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    return files if files and all(f.is_file() for f in files) else None


def _read_index(index: Path) -> dict:
    try:
        doc = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{index}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputFileError(f"{index}: must be a JSON object")
    return doc


def _active(total: float, geom: CheckpointGeometry) -> float:
    """Parameters one token uses: everything but the routed experts it is not routed to."""
    routed = 3 * geom.hidden_size * geom.moe_intermediate_size * geom.num_experts * len(geom.moe_layer_ids)
    return total - routed + routed * geom.top_k / geom.num_experts


def count_params(folder: Path, config: dict, geom: CheckpointGeometry) -> ParamCount:
    """The checkpoint's parameters from the best source in `folder` (see the module docstring).
    Tensors of layers past num_hidden_layers (MTP heads) are left out: no causal-LM model builds them."""
    files = _weight_files(folder)
    if files is not None:
        total = 0
        for f in files:
            header = read_safetensors_header(f)
            names = set(header)
            total += sum(tensor_params(k, v, names) for k, v in header.items()
                         if k != "__metadata__" and _built(k, geom.num_hidden_layers))
        plural = "s" if len(files) > 1 else ""
        return ParamCount(total, _active(total, geom), f"safetensors headers ({len(files)} file{plural})", True)
    index = folder / "model.safetensors.index.json"
    size = _read_index(index).get("metadata", {}).get("total_size") if index.is_file() else None
    if isinstance(size, int) and quant_method(config) is None:
        per = geom.dense_dtype_bytes
        total = size // per
        return ParamCount(total, _active(total, geom), f"computed: index total_size {size} bytes / {per} bytes per "
                          "parameter (no weights here)", True)
    why = "index total_size mixes quantised and unquantised bytes" if isinstance(size, int) else \
        "no weights and no index total_size here"
    total = geometry_params(config, geom)
    return ParamCount(total, _active(total, geom), f"computed from config.json's geometry, approximate ({why})",
                      False)


def _built(name: str, layers: int) -> bool:
    m = _LAYER.search(name)
    return m is None or int(m.group(1)) < layers


def _attention_params(config: dict, hidden: int) -> int:
    """One attention block: multi-head latent attention (deepseek) or plain q/k/v/o projections."""
    heads = int(config.get("num_attention_heads") or 1)
    if config.get("kv_lora_rank"):
        q_lora, kv_lora = int(config.get("q_lora_rank") or 0), int(config["kv_lora_rank"])
        nope, rope, v = (int(config.get(k) or 0) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        q = hidden * heads * (nope + rope) if not q_lora else hidden * q_lora + q_lora + q_lora * heads * (nope + rope)
        return q + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v) + heads * v * hidden
    head_dim = int(config.get("head_dim") or hidden // heads)
    v_dim = int(config.get("v_head_dim") or head_dim)
    kv = int(config.get("num_key_value_heads") or heads)
    bias = config.get("attention_bias") or config.get("qkv_bias")
    qkv = hidden * (heads * head_dim + kv * head_dim + kv * v_dim)
    return qkv + heads * v_dim * hidden + (heads * head_dim + kv * (head_dim + v_dim) if bias else 0)


def geometry_params(config: dict, geom: CheckpointGeometry) -> int:
    """Parameters computed from config.json: embeddings, attention, norms, routers, routed,
    shared and dense MLPs. Approximate (biases and small per-family extras are not all known)."""
    h, layers = geom.hidden_size, geom.num_hidden_layers
    vocab = int(config.get("vocab_size") or 0)
    embed = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    moe = 3 * h * geom.moe_intermediate_size * geom.num_experts + h * geom.num_experts \
        + 3 * h * geom.shared_intermediate_size
    if geom.expert_bias:
        moe += geom.num_experts * (2 * geom.moe_intermediate_size + h) + geom.num_experts
    dense = 3 * h * int(config.get("intermediate_size") or 0)
    n_moe = len(geom.moe_layer_ids)
    per_layer = _attention_params(config, h) + 2 * h
    return embed + h + layers * per_layer + n_moe * moe + (layers - n_moe) * dense

