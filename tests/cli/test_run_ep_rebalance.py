"""A live-rebalancing EP run on a trace achieves exactly the balancedness that replaying the trace
under the same rebalancing rule predicts, moves included (`replay_rebalancing`)."""

from __future__ import annotations

import json
import sys

import pytest

from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace
from tests.runtime.ep.harness import env_for_ranks, run_job, tiny_ep_recipe


def test_a_rebalancing_run_achieves_the_replayed_prediction(tmp_path):
    # 32 experts, 40 tokens per rank and step, from a contiguous start: the rule moves the map
    # once the counts show a better one (the replay of this trace moves it at step 4).
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2, **{"model.num_experts": 32, "traffic.batch": 40,
                                                         "hotsplit.eplb_steps": 2})
    trace = tmp_path / "t.npz"
    save_trace(trace, synthetic_trace(zipf_shares(2, 32, 1.2, 3), (1, 2), 8, 80, 2, seed=3))
    env = env_for_ranks()
    env["HOTSPLIT_DYNAMIC"] = "0"
    done = run_job([sys.executable, "-m", "hotsplit_cli", "run", str(recipe), "--trace", str(trace), "--json"],
                   env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout)["summary"]
    moves = [r for r in s["rebalances"] if r["skipped"] is None]
    assert [r["step"] for r in s["rebalances"]] == [2, 4, 6] and len(moves) == 1, s["rebalances"]
    assert s["balancedness"] == pytest.approx(s["predicted_balancedness"], abs=1e-12)
    # the move's prediction judged on the window after it, in --json and in the text
    (move,) = moves
    assert move["achieved_after"] is not None
    off = abs(move["predicted_after"] - move["achieved_after"])
    assert s["rebalance_error"] == {"count": 1, "mean_abs": pytest.approx(off), "max_abs": pytest.approx(off)}
    text = run_job([sys.executable, "-m", "hotsplit_cli", "run", str(recipe), "--trace", str(trace)], env=env)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "rebalance predictions vs the next" in text.stdout and f"off by {off:.4f} on average" in text.stdout
