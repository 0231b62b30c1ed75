"""`ledger --plan` and `place --platform --plan` under an auto plan: each expert counted at the
bytes of the precision the plan chose for it, never at native."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "hist_quality_tiny.json"
HIDDEN, INTER = 256, 128  # recipes/tiny.yaml: hidden_size, moe_intermediate_size (bf16 experts)
# One expert's stored bytes (docs/precision.md): gate, up [I, H] and down [H, I].
BYTES = {"native": 3 * HIDDEN * INTER * 2,
         "fp8": 3 * HIDDEN * INTER + 4 * (2 * (INTER // 128) * (HIDDEN // 128) + (HIDDEN // 128) * (INTER // 128)),
         "mxfp4": 3 * HIDDEN * INTER // 2 + (2 * INTER * HIDDEN + HIDDEN * INTER) // 32}


def _recipe(tmp_path: Path, ep: int) -> Path:
    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": ep}
    path = tmp_path / f"ep{ep}.yaml"
    path.write_text(yaml.safe_dump(rec))
    return path


def _auto_plan(cli, tmp_path: Path, recipe) -> Path:
    hist = Path(shutil.copy(FIXTURE, tmp_path / "h.json"))
    plan = tmp_path / "plan.json"
    r = cli("plan", hist, "--recipe", recipe, "--hot-gib", "0.004", "--precision", "auto", "--max-error", "0.03",
            "-o", plan)
    assert r.code == 0, r.err
    return plan


def _sizes(plan: Path) -> np.ndarray:
    """[L, E] stored bytes of each expert, from the plan's `precision.by_layer`."""
    by_layer = json.loads(plan.read_text())["precision"]["by_layer"]
    out = np.zeros((4, 32), dtype=np.int64)
    for i, layer in enumerate(range(1, 5)):
        for p, ids in by_layer[str(layer)].items():
            out[i, ids] = BYTES[p]
    return out


@pytest.mark.parametrize("ep", [1, 2])
def test_ledger_of_an_auto_plan_counts_each_experts_stored_bytes(cli, tmp_path, ep):
    recipe = _recipe(tmp_path, ep)
    plan = _auto_plan(cli, tmp_path, recipe)
    r = cli("ledger", recipe, "--plan", plan, "--precision", "auto", "--json")
    assert r.code == 0, r.err
    mem = json.loads(r.out)["memory"]
    sizes = _sizes(plan)
    per_rank = [int(sizes[:, r * 32 // ep:(r + 1) * 32 // ep].sum()) for r in range(ep)]
    assert len(set(per_rank)) == ep  # the ranks hold different bytes: the largest is the rank's figure
    assert mem["precision"] == "auto" and mem["expert_bytes"] is None and mem["expert_bytes_full"] is None
    assert mem["bank_bytes_per_rank"] == max(per_rank)
    assert mem["bank_bytes_total"] == mem["host_bytes_all_ranks"] == int(sizes.sum())
    assert mem["bank_bytes_total"] < 4 * 32 * BYTES["native"]
    doc = json.loads(plan.read_text())
    assert mem["hot_experts"] == len([e for ids in doc["ranks"][0]["hot"].values() for e in ids])
    assert mem["hot_gib"] == pytest.approx(doc["budget_bytes"] / 2**30) and mem["hot_source"] == "plan"
    counts = {p: n["hot"] + n["cold"] for p, n in doc["precision"]["experts"].items() if n["hot"] + n["cold"]}
    assert mem["stored"] == {p: {"expert_bytes": BYTES[p], "expert_bytes_full": BYTES[p], "experts": n}
                             for p, n in counts.items()}
    assert json.loads(r.out)["a2a"]["expert_bytes_per_card"] == max(per_rank)
    human = cli("ledger", recipe, "--plan", plan, "--precision", "auto")
    assert human.code == 0 and "stored auto" in human.out and f"fp8: {counts['fp8']} experts" in human.out


def test_a_uniform_ledger_keeps_its_shape(cli):
    mem = json.loads(cli("ledger", "tiny", "--json").out)["memory"]
    assert "stored" not in mem and mem["expert_bytes"] == BYTES["native"]


@pytest.mark.parametrize("args, message", [
    (("--precision", "auto"), "--precision auto: ledger counts the precisions an auto plan chose, and no --plan "
     "was given; pass --plan made with `hotsplit plan --precision auto --max-error E`"),
    (("--plan", "PLAN"), "planned at precision auto, but experts are stored at native (default)"),
    (("--plan", "PLAN", "--precision", "auto", "--hot-gib", "1"), "--hot-gib 1 disagrees with the budget of"),
])
def test_bad_ledger_plan_requests_are_one_line(cli, tmp_path, args, message):
    plan = _auto_plan(cli, tmp_path, "tiny")
    r = cli("ledger", "tiny", *(str(plan) if a == "PLAN" else a for a in args))
    assert r.code == 2 and message in r.err, r.err
    assert r.err.startswith("error: ") and r.err.count("\n") == 1 and r.out == ""
