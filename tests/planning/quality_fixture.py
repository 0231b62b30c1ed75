"""Histograms with a `quality` block, shaped like what `balance --model` measures on a checkpoint:
Zipf-skewed routing of a recipe's MoE layers, windows, and per-expert relative errors of the
sizes e4m3 and MXFP4 rounding give (about 2% and 12%, varying by expert); unrouted experts null."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import zipf_shares

FP8_ERROR, MXFP4_ERROR = 0.02, 0.12  # typical relative output errors of one expert (order of magnitude)


def quality_block(counts_LE: np.ndarray, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    spread = rng.uniform(0.5, 1.5, counts_LE.shape)  # some experts quantise worse than others

    def table(scale: float) -> list:
        err = scale * spread * rng.uniform(0.9, 1.1, counts_LE.shape)
        return [[None if c == 0 else round(float(x), 6) for c, x in zip(cr, er, strict=True)]
                for cr, er in zip(counts_LE, err, strict=True)]

    return {"measured_on": "test fixture: errors of the sizes fp8 / mxfp4 rounding give, not measured",
            "expert_error": {"fp8": table(FP8_ERROR), "mxfp4": table(MXFP4_ERROR)},
            "model": {"fp8": {"agreement": 0.995, "mean_kl": 0.0008, "tokens": 4096},
                      "mxfp4": {"agreement": 0.96, "mean_kl": 0.012, "tokens": 4096}}}


def write_quality_hist(path: Path, recipe: str = "tiny", windows: int = 4, seed: int = 0,
                       tokens_per_window: int = 512) -> Path:
    """A histogram of `recipe`'s shape with `windows` windows and a quality block."""
    m = load_recipe(recipe).model
    rng = np.random.default_rng(seed)
    shares = zipf_shares(m.num_moe_layers, m.num_experts, 1.1, seed)
    win = np.stack([rng.multinomial(tokens_per_window * m.top_k, (shares / shares.sum()).ravel())
                    .reshape(shares.shape) for _ in range(windows)]).astype(np.float64)
    save_hist(path, Histogram(m.name, "test fixture (zipf 1.1)", m.top_k, tokens_per_window * windows,
                              tuple(m.moe_layer_ids), win.sum(0), windows_WLE=win, steps_per_window=8))
    doc = json.loads(path.read_text())
    doc["quality"] = quality_block(win.sum(0), seed)
    path.write_text(json.dumps(doc))
    return path
