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


# --- place --platform --plan ---

PLATFORM = {"schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z", "reasons": [],
            "host": {"numa_nodes": [{}], "copy_gbps": 20.0},
            "gpus": [{"index": 0, "mem_free_bytes": 1 << 30, "summary": {"zero_copy_read_gbps": 25.0}}]}


def _place(cli, tmp_path: Path, recipe: Path, *extra):
    platform = tmp_path / "pf.json"
    platform.write_text(json.dumps(PLATFORM))
    return cli("place", tmp_path / "h.json", "--recipe", recipe, "--ranks", "4", "--redundant", "4",
               "--platform", platform, "--balance", "tokens", "-o", tmp_path / "pl.json", "--json", *extra)


def test_place_times_each_expert_of_an_auto_plan_at_its_stored_bytes(cli, tmp_path, monkeypatch):
    from hotsplit_cli.placement.file import load_placement

    recipe = _recipe(tmp_path, 4)
    hist = Path(shutil.copy(FIXTURE, tmp_path / "h.json"))
    plan = tmp_path / "plan.json"
    # A budget below the smallest expert: nothing hot, so every slot is read cold at its bytes.
    assert cli("plan", hist, "--recipe", recipe, "--hot-gib", "0.00001", "--precision", "auto", "--max-error", "0.2",
               "-o", plan).code == 0
    monkeypatch.setenv("HOTSPLIT_PRECISION", "auto")
    r = _place(cli, tmp_path, recipe, "--plan", plan)
    assert r.code == 0, r.err
    got = json.loads(r.out)["times"]["layouts"]["tokens"]["fitted"]["step_ms"]
    # Worked out here: each slot read with chance 1 - (1 - pi / replicas)^16 at 25 GB/s (pi = top-k
    # x share, at most 1), at the bytes of its logical expert's precision; the step waits for the
    # slowest rank of each layer.
    layout = load_placement(tmp_path / "pl.json")
    counts = np.asarray(json.loads(hist.read_text())["counts"], dtype=float)
    pi = np.minimum(1.0, 4 * counts / counts.sum(axis=1, keepdims=True))  # a token routes to an expert once
    sizes = _sizes(plan)
    step = 0.0
    for i in range(4):
        phy = layout.phy2log_LP[i]
        replicas = np.bincount(phy, minlength=32)
        ms = (1 - (1 - pi[i, phy] / replicas[phy]) ** 16) * sizes[i, phy] / 25e9 * 1e3
        step += ms.reshape(4, -1).sum(axis=1).max()
    assert got == pytest.approx(step, rel=1e-9)
    monkeypatch.setenv("HOTSPLIT_PRECISION", "native")
    native = json.loads(_place(cli, tmp_path, recipe, "--hot-gib", "0.00001").out)["times"]["layouts"]["tokens"]
    assert got < native["fitted"]["step_ms"]


def test_place_time_balance_under_an_auto_plan_is_never_slower(cli, tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, 4)
    plan = _auto_plan(cli, tmp_path, recipe)
    monkeypatch.setenv("HOTSPLIT_PRECISION", "auto")
    r = _place(cli, tmp_path, recipe, "--plan", plan)
    assert r.code == 0, r.err
    times = json.loads(r.out)["times"]
    assert times["budget_bytes"] == json.loads(plan.read_text())["budget_bytes"]
    rows = times["layouts"]
    assert rows["time"]["fitted"]["step_ms"] <= rows["tokens"]["fitted"]["step_ms"]


@pytest.mark.parametrize("env, args, message", [
    ("auto", (), "HOTSPLIT_PRECISION auto: place times the precisions an auto plan chose, and no --plan was given"),
    ("native", ("--plan", "PLAN"), "planned at precision auto, but experts are stored at native (HOTSPLIT_PRECISION)"),
])
def test_bad_place_plan_requests_are_one_line_and_write_nothing(cli, tmp_path, monkeypatch, env, args, message):
    recipe = _recipe(tmp_path, 4)
    plan = _auto_plan(cli, tmp_path, recipe)
    monkeypatch.setenv("HOTSPLIT_PRECISION", env)
    r = _place(cli, tmp_path, recipe, *(str(plan) if a == "PLAN" else a for a in args))
    assert r.code == 2 and message in r.err, r.err
    assert r.err.startswith("error: ") and r.err.count("\n") == 1 and r.out == ""
    assert not (tmp_path / "pl.json").exists()


def test_place_plan_without_a_platform_is_refused(cli, tmp_path):
    plan = _auto_plan(cli, tmp_path, _recipe(tmp_path, 4))
    r = cli("place", tmp_path / "h.json", "--ranks", "4", "--plan", plan, "-o", tmp_path / "pl.json")
    assert r.code == 2 and "--plan gives the budget and stored precisions the ranks are timed at and needs " \
                           "--platform" in r.err and r.out == ""
    assert not (tmp_path / "pl.json").exists()


def test_ledger_of_a_uniform_plan_takes_its_budget_at_its_precision(cli, tmp_path):
    hist = Path(shutil.copy(FIXTURE, tmp_path / "h.json"))
    plan = tmp_path / "plan.json"
    assert cli("plan", hist, "--recipe", "tiny", "--hot-gib", "0.004", "--precision", "fp8", "-o", plan).code == 0
    r = cli("ledger", "tiny", "--plan", plan, "--precision", "fp8", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    mem = doc["memory"]
    assert "stored" not in mem and mem["expert_bytes"] == BYTES["fp8"] and mem["hot_source"] == "plan"
    assert mem["hot_experts"] == json.loads(plan.read_text())["budget_bytes"] // BYTES["fp8"]
    assert mem["bank_bytes_per_rank"] == 4 * 32 * BYTES["fp8"] and doc["plan"] == str(plan)
