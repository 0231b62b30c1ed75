"""What an export produces: the engine's document, its start flags and what it keeps on the GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hotsplit_cli.hotset.gpu_fit import GpuFit

MODEL = {"MODEL": "the model's Hugging Face id or checkpoint folder"}  # what each engine's model argument names


@dataclass(frozen=True)
class EngineExport:
    """One engine's file and how the engine will use it.

    `payload` is what the file holds (a dict for JSON / YAML, a float32 array for a `.pt`, a
    str for text); `gpu_experts` maps each MoE layer id to one list of expert ids per rank (a
    rank's GPU experts, or its slots in order for a placement)."""

    engine: str
    payload: Any
    flags: list[str]  # the command line that starts the engine: its program, then its arguments
    gpu_experts: dict[int, list[list[int]]]
    gpu_bytes: int  # bytes of the GPU experts on the busiest rank
    predicted_hit_rate: float  # share of routed assignments the engine's GPU set serves
    plan_hit_rate: float  # the same for the plan or placement exported
    notes: list[str] = field(default_factory=list)  # what the engine can and cannot do with it
    snippet: str | None = None  # a config fragment to paste (TensorRT-LLM's extra options)
    fill_in: dict[str, str] = field(default_factory=dict)  # placeholder in `flags` -> what to put there
    gpu: GpuFit | None = None  # gpu_bytes against the recipe's GPU memory (targets.export sets it)
    prepare: list[str] | None = None  # a command to run first (llama.cpp: llama-quantize at the plan's precisions)

    def to_doc(self, file: str) -> dict:
        return {"engine": self.engine, "file": file, "flags": self.flags, "fill_in": self.fill_in,
                "gpu_experts": {str(layer): ranks for layer, ranks in self.gpu_experts.items()},
                "gpu_bytes": self.gpu_bytes, "gpu_memory": self.gpu.to_doc() if self.gpu else None,
                "predicted_hit_rate": self.predicted_hit_rate,
                "plan_hit_rate": self.plan_hit_rate, "notes": self.notes, "snippet": self.snippet,
                "prepare": self.prepare}


def hit_rate(counts_LE: np.ndarray, on_gpu_LE: np.ndarray) -> float:
    """Share of all routed assignments whose expert is on the GPU (0 for an empty histogram)."""
    total = float(counts_LE.sum())
    return float(counts_LE[on_gpu_LE].sum()) / total if total > 0 else 0.0


def slots_by_rank(phy2log_P: np.ndarray, num_ranks: int) -> list[list[int]]:
    """One layer's physical slots cut into ranks: rank r owns slots [r*S/R, (r+1)*S/R)."""
    return [part.tolist() for part in np.split(np.asarray(phy2log_P), num_ranks)]
