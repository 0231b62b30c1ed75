"""Routing histograms (`hotsplit.hist/1`): read with every validation rule, write atomically.

Shape letters: L = MoE layers, E = routed experts per layer, W = windows.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from hotsplit_cli.core.checks import NOT_FINITE, check_finite_nonneg, index_str
from hotsplit_cli.core.errors import HistogramError, UsageError
from hotsplit_cli.core.jsonio import TAKEN_BY, read_json, schema_tag, write_json_atomic
from hotsplit_cli.traffic.quality import Quality, quality_from_doc

KIND = "hist"
# Optional blocks measured beside the counts, kept as read and written as given, each checked by
# its own strict reader when used (hotset/lookahead.py). The `quality` block is read strictly
# with the histogram (traffic/quality.py): rerank merges it.
MEASURED_BLOCKS = ("lookahead",)


def utc_now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Histogram:
    """Routed-assignment counts per (MoE layer, expert), optionally split into windows."""

    model: str
    source: str  # how it was captured: real data with origin, or generated (and how)
    top_k: int
    tokens: int
    layers: tuple[int, ...]  # model layer index of each row
    counts_LE: np.ndarray  # float64 [L, E], finite, >= 0
    created: str = field(default_factory=utc_now)
    windows_WLE: np.ndarray | None = None  # float64 [W, L, E]
    steps_per_window: int | None = None
    recipe: str | None = None  # the recipe it was captured with (a path relative to the histogram's folder, or a name)
    quality: Quality | None = None  # fp8 / mxfp4 errors measured on its checkpoint (traffic/quality.py)
    blocks: dict = field(default_factory=dict)  # MEASURED_BLOCKS present: name -> its JSON object

    @property
    def num_experts(self) -> int:
        return int(self.counts_LE.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.counts_LE.shape[0])

    def to_doc(self) -> dict:
        doc = {
            "schema": schema_tag(KIND),
            "model": self.model,
            "source": self.source,
            "created": self.created,
            "top_k": int(self.top_k),
            "tokens": int(self.tokens),
            "layers": [int(x) for x in self.layers],
            "num_experts": self.num_experts,
            "counts": _as_json_numbers(self.counts_LE),
        }
        if self.recipe is not None:
            doc["recipe"] = self.recipe
        if self.quality is not None:
            doc["quality"] = self.quality.to_doc()
        doc.update({k: self.blocks[k] for k in MEASURED_BLOCKS if k in self.blocks})
        if self.windows_WLE is not None:
            doc["windows"] = {
                "steps_per_window": int(self.steps_per_window or 0),
                "counts": _as_json_numbers(self.windows_WLE),
            }
        return doc


def _as_json_numbers(a: np.ndarray):
    """Integral arrays are written as ints (smaller files, exact); others as floats."""
    if np.all(np.equal(np.mod(a, 1), 0)) and np.abs(a).max(initial=0) < 2**53:
        return a.astype(np.int64)
    return a


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_hist(path: str | os.PathLike, hist: Histogram) -> Path:
    """Validate counts and windows by the rules `load_hist` applies, then write atomically (a bad
    histogram never reaches the disk)."""
    validate_counts(hist.counts_LE, hist.layers, str(path))
    if hist.windows_WLE is not None:
        windows = np.asarray(hist.windows_WLE, dtype=np.float64)
        if windows.ndim != 3 or len(windows) == 0:
            raise HistogramError(f"{path}: `windows.counts` must be [windows, layers, experts], "
                                 f"got shape {list(windows.shape)}")
        validate_windows(windows, hist.counts_LE.shape, str(path))
    doc = hist.to_doc()
    if hist.quality is not None:  # by the reader's rules, before anything is written
        quality_from_doc(doc["quality"], hist.counts_LE.shape, str(path))
    return write_json_atomic(path, doc)


def load_hist(path: str | os.PathLike) -> Histogram:
    """Read and validate a `hotsplit.hist/1` file; raise `HistogramError` naming field and index."""
    return hist_from_doc(read_json(path, HistogramError, nonfinite=True), str(path))


def _check_schema(schema: object, where: str) -> None:
    if isinstance(schema, str) and schema.startswith("hotsplit.") and not schema.startswith(f"hotsplit.{KIND}/"):
        kind = schema.split("/")[0]
        raise HistogramError(f"{where}: is a {kind} file ({TAKEN_BY.get(kind[9:], 'another command')} take it), "
                             f"not a routing histogram", "pass a hotsplit.hist/1 file (`hotsplit balance -o`)")
    if schema != schema_tag(KIND):
        raise HistogramError(
            f"{where}: schema {schema!r} is not {schema_tag(KIND)!r}",
            "import engine dumps with `hotsplit hist import`",
        )


def _windows_of(windows: object, shape: tuple[int, int], where: str) -> tuple[np.ndarray | None, int | None]:
    """The optional `windows` block: (counts [W, L, E], steps per window), or (None, None)."""
    if windows is None:
        return None, None
    if not isinstance(windows, dict) or "counts" not in windows:
        raise HistogramError(f"{where}: `windows` must be an object with `counts`")
    spw = _nonneg_int(windows.get("steps_per_window", 0), where, "windows.steps_per_window", 0)
    w = windows["counts"]
    if not isinstance(w, list) or not w:
        raise HistogramError(f"{where}: `windows.counts` must be a non-empty list")
    mats = [_matrix(m, where, f"windows.counts[{i}]") for i, m in enumerate(w)]
    validate_windows(mats, shape, where)
    return np.stack(mats), spw


def hist_from_doc(doc: object, where: str) -> Histogram:
    if not isinstance(doc, dict):
        raise HistogramError(f"{where}: expected a JSON object")
    _check_schema(doc.get("schema"), where)
    for key in ("model", "source", "top_k", "tokens", "layers", "num_experts", "counts"):
        if key not in doc:
            raise HistogramError(f"{where}: missing field `{key}`")
    for key in ("model", "source"):
        if not isinstance(doc[key], str):
            raise HistogramError(f"{where}: `{key}` must be a string")
    top_k = _nonneg_int(doc["top_k"], where, "top_k", minimum=1)
    tokens = _nonneg_int(doc["tokens"], where, "tokens", minimum=0)
    layers = doc["layers"]
    if not isinstance(layers, list) or not layers:
        raise HistogramError(f"{where}: `layers` must be a non-empty list of layer ids")
    for i, x in enumerate(layers):
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            raise HistogramError(f"{where}: `layers[{i}]` must be a non-negative int, got {x!r}")
    num_experts = _nonneg_int(doc["num_experts"], where, "num_experts", minimum=1)
    counts = _matrix(doc["counts"], where, "counts")
    if counts.shape[0] != len(layers):
        raise HistogramError(
            f"{where}: `counts` has {counts.shape[0]} rows but `layers` names {len(layers)} layers"
        )
    if counts.shape[1] != num_experts:
        raise HistogramError(
            f"{where}: `num_experts` is {num_experts} but `counts[0]` has {counts.shape[1]} entries"
        )
    validate_counts(counts, layers, where)
    windows_WLE, spw = _windows_of(doc.get("windows"), counts.shape, where)
    recipe = doc.get("recipe")  # optional: older files have none
    if recipe is not None and not isinstance(recipe, str):
        raise HistogramError(f"{where}: `recipe` must be a string")
    quality = doc.get("quality")
    return Histogram(
        model=doc["model"],
        source=doc["source"],
        created=str(doc.get("created", "")),
        top_k=top_k,
        tokens=tokens,
        layers=tuple(layers),
        counts_LE=counts,
        windows_WLE=windows_WLE,
        steps_per_window=spw,
        recipe=recipe,
        quality=None if quality is None else quality_from_doc(quality, counts.shape, where),
        blocks={k: doc[k] for k in MEASURED_BLOCKS if k in doc},
    )


def _nonneg_int(x: object, where: str, name: str, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise HistogramError(f"{where}: `{name}` must be an int >= {minimum}, got {x!r}")
    return x


def _matrix(rows: object, where: str, name: str) -> np.ndarray:
    """A list of equal-length lists of numbers -> float64 [R, C]; ragged rows are named."""
    if not isinstance(rows, list) or not rows:
        raise HistogramError(f"{where}: `{name}` must be a non-empty list of rows")
    width = len(rows[0]) if isinstance(rows[0], list) else None
    numbers = {int, float}  # exact types, as JSON gives them: a bool is not a count
    if width and all(type(row) is list and len(row) == width and set(map(type, row)) <= numbers for row in rows):
        return np.asarray(rows, dtype=np.float64)  # the common case, checked at C speed
    width = None
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise HistogramError(f"{where}: `{name}[{i}]` must be a list of numbers")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise HistogramError(
                f"{where}: `{name}[{i}]` has {len(row)} entries, `{name}[0]` has {width} (ragged rows)"
            )
        for j, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise HistogramError(f"{where}: `{name}[{i}][{j}]` is not a number: {x!r}")
    if not width:
        raise HistogramError(f"{where}: `{name}[0]` is empty")
    return np.asarray(rows, dtype=np.float64)


def _check_values(a: np.ndarray, where: str, name: str) -> None:
    def message(idx: tuple[int, ...], problem: str) -> str:
        rule = "must be finite" if problem == NOT_FINITE else "counts must be >= 0"
        return f"{where}: `{name}{index_str(idx)}` is {a[idx]} ({rule})"

    check_finite_nonneg(a, HistogramError, message)


def validate_windows(windows_WLE, shape: tuple[int, ...], where: str) -> None:
    """Each window's counts [L, E]: the shape of `counts`, finite and >= 0."""
    for i, m in enumerate(windows_WLE):
        if m.shape != shape:
            raise HistogramError(f"{where}: `windows.counts[{i}]` has shape {list(m.shape)}, expected {list(shape)}")
        _check_values(m, where, f"windows.counts[{i}]")


def validate_counts(counts_LE: np.ndarray, layers, where: str) -> None:
    """Every value rule of SPEC: finite, >= 0, not all zero, 2-D, distinct layer ids."""
    if counts_LE.ndim != 2:
        raise HistogramError(f"{where}: `counts` must be 2-D [layers, experts], got {counts_LE.ndim}-D")
    if counts_LE.shape[0] != len(layers):
        raise HistogramError(
            f"{where}: `counts` has {counts_LE.shape[0]} rows but `layers` names {len(layers)} layers"
        )
    seen: dict[int, int] = {}
    for i, layer in enumerate(layers):
        if layer in seen:
            raise HistogramError(f"{where}: `layers[{i}]` repeats layer {layer} (first at index {seen[layer]})")
        seen[layer] = i
    _check_values(counts_LE, where, "counts")
    if not counts_LE.any():
        raise HistogramError(f"{where}: `counts` is all zero", "the capture saw no routed tokens")


def recorded_recipe(path: str | os.PathLike) -> str:
    """The recipe a histogram records (a path resolved against its folder, or a shipped name);
    UsageError when it records none."""
    hist = load_hist(path)
    if hist.recipe is None:
        raise UsageError(f"{path} records no recipe: plan needs --recipe to know the expert sizes and parallelism",
                         "pass --recipe NAME (shipped: recipes/*.yaml) or a YAML path")
    beside = Path(path).parent / hist.recipe
    return str(beside) if beside.is_file() else hist.recipe
