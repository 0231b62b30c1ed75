"""What storing experts at fp8 or mxfp4 costs in quality, as measured on the user's model: the
optional `quality` block of a `hotsplit.hist/1` file (docs/precision.md has the schema), read
and checked with the histogram, kept when a histogram is written again.

Shape letters: L = MoE layers, E = routed experts. An expert's error is its relative output
error ||y_q - y|| / ||y|| on its own routed tokens (y native, y_q at the stored precision); the
expected error of a choice of precisions is the routing-share-weighted sum of those errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hotsplit_cli.core.errors import HistogramError

MEASURED = ("fp8", "mxfp4")  # precisions an error is measured at; native's error is 0 by definition
BLOCK_KEYS = {"measured_on", "expert_error", "model"}
MODEL_KEYS = {"agreement", "mean_kl", "tokens"}


@dataclass(frozen=True)
class Quality:
    """A histogram's measured errors. error_LE[p] is nan where expert (l, e) was never routed."""

    measured_on: str  # where: checkpoint, prompts, tokens (as the measurement wrote it)
    error_LE: dict[str, np.ndarray]  # precision -> float64 [L, E], >= 0 or nan (unmeasured)
    model: dict[str, dict]  # precision -> {"agreement", "mean_kl", "tokens"}: uniform precision vs native

    def to_doc(self) -> dict:
        return {"measured_on": self.measured_on,
                "expert_error": {p: [[None if math.isnan(x) else float(x) for x in row] for row in e.tolist()]
                                 for p, e in self.error_LE.items()},
                "model": self.model}


def quality_from_doc(block: object, shape: tuple[int, int], where: str) -> Quality:
    """Check a `quality` block against the histogram's [L, E] shape; HistogramError names the field."""
    if not isinstance(block, dict):
        raise HistogramError(f"{where}: `quality` must be an object")
    unknown = sorted(set(block) - BLOCK_KEYS)
    if unknown:
        raise HistogramError(f"{where}: `quality.{unknown[0]}` is not a field of the quality block "
                             f"({', '.join(sorted(BLOCK_KEYS))})")
    measured_on = block.get("measured_on")
    if not isinstance(measured_on, str) or not measured_on.strip():
        raise HistogramError(f"{where}: `quality.measured_on` must say where the errors were measured")
    errors = block.get("expert_error")
    if not isinstance(errors, dict) or not errors:
        raise HistogramError(f"{where}: `quality.expert_error` must map {' and/or '.join(MEASURED)} to "
                             f"[layers x experts] errors")
    error_LE = {p: _error_matrix(errors[p], shape, f"{where}: `quality.expert_error.{p}")
                for p in _known(errors, where, "expert_error")}
    model = block.get("model", {})
    if not isinstance(model, dict):
        raise HistogramError(f"{where}: `quality.model` must map a precision to its agreement and mean KL")
    checked = {p: _model_entry(model[p], f"{where}: `quality.model.{p}") for p in _known(model, where, "model")}
    return Quality(measured_on.strip(), error_LE, checked)


def _known(mapping: dict, where: str, field: str) -> list[str]:
    bad = [p for p in mapping if p not in MEASURED]
    if bad:
        raise HistogramError(f"{where}: `quality.{field}.{bad[0]}` is not a measured precision "
                             f"({', '.join(MEASURED)})")
    return [p for p in MEASURED if p in mapping]


def _error_matrix(rows: object, shape: tuple[int, int], where: str) -> np.ndarray:
    """[L][E] of numbers >= 0 or null -> float64 [L, E] with nan for null."""
    L, E = shape
    if not isinstance(rows, list) or len(rows) != L:
        raise HistogramError(f"{where}` must have one row per MoE layer ({L}), got "
                             f"{len(rows) if isinstance(rows, list) else type(rows).__name__}")
    out = np.full(shape, np.nan)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != E:
            raise HistogramError(f"{where}[{i}]` must list {E} errors, one per expert")
        for j, x in enumerate(row):
            if x is None:
                continue  # never routed: nothing to measure on
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
                raise HistogramError(f"{where}[{i}][{j}]` is {x!r} (a relative error: finite and >= 0, or null "
                                     "when the expert was never routed)")
            out[i, j] = float(x)
    return out


def _model_entry(entry: object, where: str) -> dict:
    """{"agreement": in [0, 1], "mean_kl": >= 0, "tokens": int >= 1}."""
    if not isinstance(entry, dict) or set(entry) != MODEL_KEYS:
        raise HistogramError(f"{where}` must have exactly {', '.join(sorted(MODEL_KEYS))}")
    agree, kl, tokens = entry["agreement"], entry["mean_kl"], entry["tokens"]
    if isinstance(agree, bool) or not isinstance(agree, int | float) or not 0.0 <= agree <= 1.0:
        raise HistogramError(f"{where}.agreement` is {agree!r} (a fraction of tokens, in [0, 1])")
    if isinstance(kl, bool) or not isinstance(kl, int | float) or not math.isfinite(kl) or kl < 0:
        raise HistogramError(f"{where}.mean_kl` is {kl!r} (finite and >= 0)")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise HistogramError(f"{where}.tokens` is {tokens!r} (an int >= 1)")
    return {"agreement": float(agree), "mean_kl": float(kl), "tokens": tokens}


def reordered(quality: Quality, rows: list[int]) -> Quality:
    """The same errors with the layers in another order (`rows`: old row of each new row)."""
    return Quality(quality.measured_on, {p: e[rows] for p, e in quality.error_LE.items()}, quality.model)


def filled(primary: Quality | None, fallback: Quality | None) -> Quality | None:
    """`primary`'s errors, with `fallback`'s for the experts `primary` has none for (its traffic
    never routed them), and each of its model figures, else `fallback`'s. Both must be of the
    same model, in the same layer order. `measured_on` says where each came from."""
    if primary is None or fallback is None:
        return primary or fallback
    errors, borrowed = {}, False
    for p in MEASURED:
        mine, other = primary.error_LE.get(p), fallback.error_LE.get(p)
        if mine is None or other is None:
            borrowed |= mine is None and other is not None
            chosen = mine if mine is not None else other
        else:
            borrowed |= bool((np.isnan(mine) & ~np.isnan(other)).any())
            chosen = np.where(np.isnan(mine), other, mine)
        if chosen is not None:
            errors[p] = chosen
    borrowed |= bool(set(fallback.model) - set(primary.model))
    where = primary.measured_on + (f"; the rest: {fallback.measured_on}" if borrowed else "")
    return Quality(where, errors, {**fallback.model, **primary.model})


def quality_summary(quality: Quality) -> list[dict]:
    """Per measured precision: how many routed experts have an error, their median and max, and
    the model's agreement and mean KL against native (None where not measured)."""
    rows = []
    for p in MEASURED:
        err = quality.error_LE.get(p)
        if err is None:
            continue
        known = err[~np.isnan(err)]
        model = quality.model.get(p, {})
        rows.append({"precision": p, "experts": int(known.size),
                     "median_error": float(np.median(known)) if known.size else None,
                     "max_error": float(known.max()) if known.size else None,
                     "agreement": model.get("agreement"), "mean_kl": model.get("mean_kl"),
                     "tokens": model.get("tokens")})
    return rows


def measured_quality(measured, where: str) -> Quality:
    """The block of a measurement on a checkpoint (`measured`: hotsplit_runtime.hf.quality's
    MeasuredQuality: error_LE, model, native, skipped), `where` naming checkpoint, prompts and
    tokens; `measured_on` also says which precision is the checkpoint's own and what was left out."""
    words = [where]
    if measured.native in MEASURED:
        words.append(f"experts stored at {measured.native}: its error is 0, not measured")
    words += [f"{p} not measured: {why}" for p, why in measured.skipped.items()]
    return Quality("; ".join(words), dict(measured.error_LE), dict(measured.model))


def quality_line(row: dict) -> str:
    """One row of `quality_summary`, for people."""
    if row["median_error"] is None:
        errors = "no routed expert measured"
    else:
        errors = (f"expert error median {row['median_error']:.3g}, max {row['max_error']:.3g} over "
                  f"{row['experts']} routed experts")
    if row["agreement"] is None:
        return f"{row['precision']}: {errors}"
    return (f"{row['precision']}: {errors}; next-token agreement {100 * row['agreement']:.1f}%, "
            f"mean KL {row['mean_kl']:.3g} over {row['tokens']} tokens")
