"""Routing traces (`.npz`): `topk_ids` [steps, layers, tokens_per_step, top_k], `layers` [L],
optional `topk_weights` of the same shape. Captured by `balance --trace`, replayed by
`simulate` and `run`. Shape letters: S = steps, L = MoE layers, T = tokens per step, K = top_k.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.core.jsonio import sniff_kind, write_atomic


@dataclass(frozen=True)
class Trace:
    topk_ids_SLTK: np.ndarray  # int [S, L, T, K]; -1 marks a padding slot (not counted)
    layers: tuple[int, ...]
    topk_weights_SLTK: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.topk_ids_SLTK.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk_ids_SLTK.shape[3])

    def counts_SLE(self, num_experts: int) -> np.ndarray:
        """Routed assignments per step, layer and expert (float64 [S, L, E])."""
        S, L, T, K = self.topk_ids_SLTK.shape
        ids = self.topk_ids_SLTK.reshape(S, L, T * K).astype(np.int64)
        valid = ids >= 0
        flat = (np.arange(S * L).reshape(S, L, 1) * num_experts + ids)[valid]
        return np.bincount(flat, minlength=S * L * num_experts).reshape(S, L, num_experts).astype(np.float64)

    def counts_LE(self, num_experts: int) -> np.ndarray:
        return self.counts_SLE(num_experts).sum(axis=0)


def save_trace(path: str | os.PathLike, trace: Trace) -> Path:
    arrays = {"topk_ids": trace.topk_ids_SLTK, "layers": np.asarray(trace.layers, dtype=np.int64)}
    if trace.topk_weights_SLTK is not None:
        arrays["topk_weights"] = trace.topk_weights_SLTK
    return write_atomic(path, lambda fh: np.savez_compressed(fh, **arrays))


def check_trace_file(path: str | os.PathLike) -> None:
    """Refuse, before any work, a trace path that does not exist or holds another kind of file."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: no such file", "check the path, or capture one with `hotsplit balance --trace`")
    kind = sniff_kind(path)
    if kind and not kind.startswith("a routing trace") and "npz" not in kind:
        raise InputFileError(f"{path}: is {kind}, not a routing trace (.npz)",
                             "capture a trace with `hotsplit balance RECIPE --trace FILE.npz`")


@dataclass(frozen=True)
class Replay:
    """The trace a run replays, checked against its recipe and --steps: its first `steps` steps."""

    path: str | os.PathLike  # as the run was given it
    trace: Trace
    steps: int

    def counts_LE(self, num_experts: int) -> np.ndarray:
        """Routed assignments per (layer, expert) over the replayed steps (what a run's plan is made from)."""
        return Trace(self.trace.topk_ids_SLTK[:self.steps], self.trace.layers).counts_LE(num_experts)

    def describe(self) -> str:
        return f"trace {self.path} ({self.steps} of {self.trace.num_steps} trace steps)"


def replay_file(recipe, trace_path: str | os.PathLike | None) -> str | os.PathLike | None:
    """The trace a run of `recipe` replays: --trace (`trace_path`), else a trace recipe's own, else None."""
    t = recipe.traffic
    return trace_path or (t.path if t.kind == "trace" else None)


def load_run_replay(recipe, trace_path: str | os.PathLike | None, steps: int | None) -> Replay | None:
    """The trace a run of `recipe` replays, read and checked (`load_replay`); None: it replays none."""
    path = replay_file(recipe, trace_path)
    return None if path is None else load_replay(path, recipe, steps)


def load_replay(path: str | os.PathLike, recipe, steps: int | None) -> Replay:
    """The trace a run of `recipe` replays, checked against the recipe's MoE layers and experts
    and against --steps (`steps`, None: the whole trace), with the steps to run. One check for
    every run: a single rank's, and the expert-parallel launcher's before its ranks."""
    m = recipe.model
    trace = load_trace(path, m.num_experts)
    if len(trace.layers) != m.num_moe_layers:
        raise InputFileError(f"{path}: the trace has {len(trace.layers)} MoE layers, "
                             f"{recipe.name} has {m.num_moe_layers}", "capture the trace with the same recipe")
    if steps is not None and steps > trace.num_steps:
        raise UsageError(f"--steps {steps}: the trace {path} has {trace.num_steps} steps",
                         f"pass --steps {trace.num_steps} or less, or drop --steps to replay the whole trace")
    return Replay(path, trace, steps or trace.num_steps)  # the whole trace unless --steps


def load_trace(path: str | os.PathLike, num_experts: int | None = None) -> Trace:
    """Read and validate a trace; `num_experts` (when known) bounds the expert ids."""
    path = Path(path)
    check_trace_file(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            if "topk_ids" not in files or "layers" not in files:
                raise InputFileError(f"{path}: a trace needs arrays `topk_ids` and `layers`, found {sorted(files)}")
            ids = z["topk_ids"]
            layers = z["layers"]
            weights = z["topk_weights"] if "topk_weights" in files else None
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", "check the path") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise InputFileError(f"{path}: not a readable .npz trace ({exc})") from None
    if ids.ndim != 4 or not np.issubdtype(ids.dtype, np.integer):
        raise InputFileError(f"{path}: `topk_ids` must be an int array [steps, layers, tokens, top_k], "
                             f"got {ids.dtype} {list(ids.shape)}")
    if layers.ndim != 1 or len(layers) != ids.shape[1] or not np.issubdtype(layers.dtype, np.integer):
        raise InputFileError(f"{path}: `layers` must be int [{ids.shape[1]}], got {layers.dtype} {list(layers.shape)}")
    if len(set(layers.tolist())) != len(layers):
        raise InputFileError(f"{path}: `layers` has duplicate layer ids")
    if ids.size and ids.min() < -1:
        raise InputFileError(f"{path}: `topk_ids` has negative id {int(ids.min())} (only -1 marks padding)")
    if num_experts is not None and ids.size and ids.max() >= num_experts:
        at = tuple(int(i) for i in np.argwhere(ids >= num_experts)[0])
        raise InputFileError(f"{path}: `topk_ids{list(at)}` = {int(ids[at])} but the model has {num_experts} experts")
    if weights is not None and weights.shape != ids.shape:
        raise InputFileError(f"{path}: `topk_weights` shape {list(weights.shape)} differs from `topk_ids`")
    return Trace(ids, tuple(int(x) for x in layers), weights)
