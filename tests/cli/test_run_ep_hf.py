"""`hotsplit run` on a checkpoint recipe with parallel.ep 2: the launcher starts two ranks, each
generates its share of the prompts with the routed experts expert-parallel, and rank 0 reports
the texts, per-rank hit rates and balancedness as for a synthetic EP run. Jobs are bounded in
time and leave no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import orjson
import pytest
import yaml

pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from tests.cli.test_run_hf import _geometry  # noqa: E402
from tests.fakes.hf import SENTENCES, build_checkpoint, reference_texts  # noqa: E402
from tests.runtime.ep.harness import REPO, env_for_ranks, kill_tagged, run_job, tagged_pids  # noqa: E402

HOTSPLIT = [sys.executable, "-m", "hotsplit_cli"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("ephf") / "olmoe", "olmoe")


def _recipe(tmp_path, ckpt, prompts: list[str], max_new_tokens: int):
    g = _geometry(ckpt)
    one = 3 * g["hidden_size"] * g["moe_intermediate_size"] * 4  # fp32 bytes of one expert
    path = tmp_path / "p.jsonl"
    path.write_text("".join(orjson.dumps({"prompt": p}).decode() + "\n" for p in prompts))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "tiny-ckpt-ep",
        "model": {"kind": "hf", "path": str(ckpt), "total_params": 1.0e6, **g},
        "parallel": {"tp": 1, "ep": 2},
        "traffic": {"kind": "prompts", "path": str(path), "max_new_tokens": max_new_tokens, "batch": 1},
        "run": {"device": "cpu"},
        "hotsplit": {"hot_gib": 2 * one / 2**30, "dyn_steps": 3, "dyn_margin": 1.0},
    }))
    return recipe


def test_ep2_checkpoint_run_equals_generate_and_its_trace_prediction(tmp_path, ckpt):
    """HOTSPLIT_DYNAMIC=0: the texts equal transformers'; the balancedness and each rank's hit
    rate equal what the routing the job served predicts; 3 prompts of uneven lengths on 2 ranks."""
    prompts = [SENTENCES[0], "Hi", SENTENCES[3][:15]]
    env = {**env_for_ranks(), "HOTSPLIT_DYNAMIC": "0"}
    done = run_job([*HOTSPLIT, "run", str(_recipe(tmp_path, ckpt, prompts, 6)), "--json"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["texts"] == reference_texts(ckpt, prompts, 6)
    s = doc["summary"]
    assert s["balancedness"] == pytest.approx(s["predicted_balancedness"], abs=1e-12)
    for r in s["ranks"]:
        assert r["swaps"] == 0 and r["hit_rate"] == pytest.approx(r["predicted_hit_rate"], abs=1e-12)
    assert 0 < s["hit_rate"] < 1 and s["tokens"] > 0 and doc["parallel"]["ep"] == 2
    assert "each rank generates its share of the prompts" in done.stderr  # the header, said on stderr under --json


def test_ep2_checkpoint_run_with_swaps_and_live_rebalancing_equals_generate(tmp_path, ckpt):
    """Dynamic swaps every 2 steps (margin 1) and a rebalance check every 3 steps, over the
    all-gather exchange, shown to a person: the texts printed still equal transformers', the log
    records swaps mid-generation, and the summary has the ranks' table and each rebalance check."""
    import ast

    prompts = [SENTENCES[1], SENTENCES[4][:9], SENTENCES[2], "Hi"]
    env = {**env_for_ranks(), "HOTSPLIT_DYN_STEPS": "2", "HOTSPLIT_EPLB_STEPS": "3",
           "HOTSPLIT_EP_EXCHANGE": "allgather"}
    log = tmp_path / "log.jsonl"
    done = run_job([*HOTSPLIT, "run", str(_recipe(tmp_path, ckpt, prompts, 8)), "--log-jsonl", str(log)], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = [ast.literal_eval(x.split("] ", 1)[1]) for x in done.stdout.splitlines() if x.startswith("[")]
    assert shown == reference_texts(ckpt, prompts, 8)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert sum(r["swaps"] for r in records) > 0 and all(len(r["ranks"]) == 2 for r in records)
    out = done.stdout
    assert "each rank generates its share of the prompts" in out and "balancedness (per exchange)" in out
    assert "rebalance at step 3" in out and "ranks" in out and "exchange (allgather)" in out


def test_a_killed_rank_ends_a_checkpoint_job_within_60_s_with_one_line(tmp_path, ckpt):
    tag = uuid.uuid4().hex
    recipe = _recipe(tmp_path, ckpt, SENTENCES * 40, 200)
    proc = subprocess.Popen([*HOTSPLIT, "run", str(recipe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env_for_ranks(tag), cwd=REPO, start_new_session=True)
    try:
        for line in proc.stdout:  # the header: every rank is built and generating
            if line.startswith("expert parallel:"):
                break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        rank1 = [p for p in tagged_pids(tag) if b"RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")]
        assert len(rank1) == 1
        t0 = time.monotonic()
        os.kill(rank1[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 60
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert proc.returncode == 1 and lines == ["error: rank 1 of 2 was killed by SIGKILL; every rank was stopped"], \
            err[-2000:]
        time.sleep(0.5)
        assert tagged_pids(tag) == []  # no rank left behind
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"hotsplit-hotsplit-{proc.pid}-")]
    finally:
        kill_tagged(tag)


def test_ep2_checkpoint_run_with_lookahead_staging_equals_generate(tmp_path, ckpt):
    """Router lookahead at ep 2: each rank guesses from its own tokens and stages the cold experts
    it holds; the texts equal transformers', and each rank's staging counters are reported."""
    prompts = [SENTENCES[0], SENTENCES[3][:15]]
    env = {**env_for_ranks(), "HOTSPLIT_DYNAMIC": "0", "HOTSPLIT_PREFETCH": "lookahead",
           "HOTSPLIT_PREFETCH_SLOTS": "1", "HOTSPLIT_PREFETCH_GUESSES": "4"}
    recipe = _recipe(tmp_path, ckpt, prompts, 5)  # a budget of 2 experts: 1 hot, 1 staging slot
    done = run_job([*HOTSPLIT, "run", str(recipe), "--json"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["texts"] == reference_texts(ckpt, prompts, 5)
    staged = [r["prefetch"] for r in doc["summary"]["ranks"]]
    assert all(p["predictor"] == "lookahead" and p["slots"] == 1 for p in staged)
    assert sum(p["prefetched"] for p in staged) >= sum(p["useful"] for p in staged) > 0
