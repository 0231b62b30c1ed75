"""Histograms, plans and placements for the export tests: Zipf-skewed synthetic routing of a
recipe's real shape, or the shared SGLang / ESFT records when they are next to the checkout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import zipf_shares

ROOT = Path(__file__).resolve().parents[2]
ROUTING = ROOT.parent / "shared" / "data" / "routing"  # the shared routing records beside the checkout, if any


def synthetic_hist(path: Path, recipe_name: str, tokens: int = 4096, skew: float = 1.1, seed: int = 0) -> Path:
    """A Zipf-skewed histogram of the recipe's MoE layers x experts, integer counts."""
    m = load_recipe(recipe_name).model
    shares = zipf_shares(m.num_moe_layers, m.num_experts, skew, seed)
    counts = np.round(shares * tokens * m.top_k)
    save_hist(path, Histogram(m.name, f"synthetic zipf {skew} (test)", m.top_k, tokens, tuple(m.moe_layer_ids),
                              counts.astype(np.float64)))
    return path


def esft_hist(path: Path, task: str = "intent") -> Path:
    """deepseek-v2-lite routing counted from the shared ESFT trace (skip when it is absent)."""
    src = ROUTING / f"esft-v2lite-{task}.trace.npz"
    if not src.is_file():
        pytest.skip(f"shared routing data not found: {src}")
    with np.load(src) as z:
        ids, layers = z["topk_ids"], z["layers"]
    counts = np.stack([np.bincount(ids[:, i].ravel(), minlength=64) for i in range(ids.shape[1])]).astype(float)
    tokens = int(ids.shape[0] * ids.shape[2])
    save_hist(path, Histogram("deepseek-ai/DeepSeek-V2-Lite", f"ESFT {task} (shared data)", 6, tokens,
                              tuple(int(x) for x in layers), counts))
    return path


def sglang_hist(tmp: Path, name: str = "decode_in1000out1000") -> Path:
    """DeepSeek-R1 routing from the shared SGLang record, imported with `hist import`."""
    src = ROUTING / f"sglang-r1-{name}.json"
    if not src.is_file():
        pytest.skip(f"shared routing data not found: {src}")
    out = tmp / f"r1-{name}.hist.json"
    assert main(["hist", "import", str(src), "--from", "sglang", "--recipe", "deepseek-v3-ep8", "-o", str(out)]) == 0
    return out


def make_plan(tmp: Path, hist: Path, recipe: str, hot_gib: str, name: str = "plan.json") -> Path:
    out = tmp / name
    assert main(["plan", str(hist), "--recipe", recipe, "--hot-gib", hot_gib, "-o", str(out)]) == 0
    return out


def make_placement(tmp: Path, hist: Path, ranks: int, redundant: int = 0, name: str = "placement.json") -> Path:
    out = tmp / name
    assert main(["place", str(hist), "--ranks", str(ranks), "--redundant", str(redundant), "-o", str(out)]) == 0
    return out
