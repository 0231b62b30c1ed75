"""`plan --platform`: the prefetch verdict in the human report, --json and the plan file."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hotsplit_cli.core.jsonio import write_json_atomic
from hotsplit_cli.hotset.lookahead import LayerLookahead, Lookahead
from hotsplit_cli.traffic.hist import load_hist, save_hist

# recall 0.84 at 8 guesses per token, 1.37 wasted per useful, on tiny's MoE layers 1..4 (top-4)
LOOK = Lookahead("tests", 8, tuple(LayerLookahead(lid, lid - 1, 64, 512, 216, 256) for lid in (2, 3, 4)))


@pytest.fixture
def gpu_platform(tmp_path):
    """platform.json of one GPU reading host memory at 25 GB/s and copying at 24 GB/s."""
    return write_json_atomic(tmp_path / "gpu-platform.json", {
        "schema": "hotsplit.platform/1", "created": "2026-01-01T00:00:00Z",
        "host": {"numa_nodes": [{}], "copy_gbps": 10.0, "mem_available_bytes": None},
        "gpus": [{"index": 0, "mem_free_bytes": 80 << 30, "mem_total_bytes": 80 << 30,
                  "summary": {"zero_copy_read_gbps": 25.0, "h2d_gbps": 24.0}}], "reasons": []})


def test_plan_judges_prefetch_and_says_why_none_is_planned(cli, tiny_hist, gpu_platform, tmp_path):
    plan_file = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", gpu_platform, "--json", "-o", plan_file)
    assert r.code == 0, r.err
    pre = json.loads(r.out)["prefetch"]
    assert pre["slots"] == 0 and pre["pool"] == "shared"
    assert pre["reason"] == ("0 staging slots: the predictor's recall is unknown (the histogram records no router "
                             "lookahead: measure it on your model with `hotsplit balance --model DIR --prompts FILE`)")
    assert [s["batch"] for s in pre["steps"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert all(s["with_ms"] == s["without_ms"] for s in pre["steps"])
    assert json.loads(plan_file.read_text())["prefetch"] == pre


def test_a_measured_lookahead_recall_is_used_and_unmeasured_compute_plans_no_slots(cli, tiny_hist,
                                                                                   gpu_platform):
    hist = load_hist(tiny_hist)
    save_hist(tiny_hist, dataclasses.replace(hist, blocks={"lookahead": LOOK.to_doc()}))
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", gpu_platform)
    assert r.code == 0, r.err
    assert "prefetch: predicted decode step time" in r.out
    assert "prefetch: 0 staging slots: compute per layer is not measured" in r.out
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", gpu_platform, "--json")
    steps = json.loads(r.out)["prefetch"]["steps"]
    assert all(s["best_slots"] == 0 for s in steps)  # nothing hides a copy: a slot only costs a hot expert


def test_without_a_gpu_read_rate_there_is_no_verdict(cli, tiny_hist, fixed_rates_platform):
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--json")
    assert r.code == 0 and "prefetch" not in json.loads(r.out)
    r = cli("plan", tiny_hist, "--recipe", "tiny", "--platform", fixed_rates_platform, "--json")
    assert r.code == 0 and "prefetch" not in json.loads(r.out)  # no GPU: no staging slots
