"""`hist show --recipe` of an EP recipe reports coverage per rank: each rank holds E/ep experts of
every layer (the contiguous split) and the rank that needs the most hot experts sets the bytes."""

import json
from pathlib import Path

import numpy as np

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank
from hotsplit_cli.traffic.hist import load_hist

HIST = Path(__file__).resolve().parents[2] / "examples" / "hist-tiny.json"


def _experts_for(target: float, counts: np.ndarray) -> int:
    best = np.sort(counts.ravel())[::-1]
    return int(np.argmax(np.cumsum(best) >= target * best.sum() - 1e-9) + 1)


def test_ep_coverage_is_per_rank_under_the_contiguous_split(cli):
    done = cli("hist", "show", HIST, "--recipe", "tiny-ep4", "--json")
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    c = load_hist(HIST).counts_LE
    E, size = c.shape[1], expert_bytes_per_rank(load_recipe("tiny-ep4"))
    for key, gib in doc["cover_gib"].items():
        need = max(_experts_for(float(key), c[:, r * E // 4:(r + 1) * E // 4]) for r in range(4))
        assert doc["cover_rank_experts"][key] == need
        assert gib * 2**30 == need * size
        assert need <= c.size // 4  # never more than a rank holds
    human = cli("hist", "show", HIST, "--recipe", "tiny-ep4")
    assert "experts per rank" in human.out and "contiguously over ep 4 ranks" in human.out


def test_a_single_rank_recipe_keeps_whole_model_coverage(cli):
    doc = json.loads(cli("hist", "show", HIST, "--recipe", "tiny", "--json").out)
    assert doc["ranks"] == 1 and doc["cover_rank_experts"] is None
    size = expert_bytes_per_rank(load_recipe("tiny"))
    assert all(doc["cover_gib"][k] * 2**30 == v * size for k, v in doc["cover_experts"].items())
