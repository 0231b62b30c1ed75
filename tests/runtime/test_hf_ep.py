"""Hugging Face checkpoints expert-parallel (runtime/distributed/checkpoint.py) on CPU ranks, gloo on loopback:
each rank generates its share of the prompts, the routed experts go through the synthetic runs'
exchange, and the greedy texts equal transformers' `generate` on the same prompts. One spawn of
a rank group checks many checkpoints; each job is bounded in time and leaves nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from hotsplit_cli.placement.algorithm import Geometry  # noqa: E402
from hotsplit_cli.placement.evaluate import random_layout  # noqa: E402
from hotsplit_cli.placement.file import placement_doc, save_placement  # noqa: E402
from tests.fakes.hf import SENTENCES, reference_texts  # noqa: E402

from .ep.harness import REPO, run_job, torchrun  # noqa: E402

WORKER = str(REPO / "tests" / "runtime" / "ep" / "hf_worker.py")
# Uneven lengths and counts: on 2 ranks one rank has two prompts, the other one short one.
PROMPTS = [SENTENCES[0], SENTENCES[3][:15], "Hi"]
NEW_TOKENS = 8

pytestmark = pytest.mark.slow


def _run(tmp_path, ranks, checkpoints, **cfg):
    doc = {"checkpoints": {k: str(v) for k, v in checkpoints.items()}, "prompts": PROMPTS,
           "max_new_tokens": NEW_TOKENS, "batch": 1, "exchange": "a2a", **cfg}
    (tmp_path / "job.json").write_text(json.dumps(doc))
    done = run_job(torchrun(ranks, [WORKER, str(tmp_path / "job.json"), str(tmp_path)]))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    from tests.runtime.test_hf_fp8 import fp8_pair

    return fp8_pair(tmp_path_factory.mktemp("fp8ep"), "deepseek_v3")


def test_ep2_greedy_texts_equal_transformers_for_every_family_and_fp8(tmp_path, checkpoints, fp8_checkpoint):
    """ep 2 on a placement with replicas, a static hot set: the texts of every family and of a
    block-scaled fp8 checkpoint equal transformers'; the ranks finish their prompts at different
    steps and the done one keeps exchanging; each rank's loads and hits equal what the routing the
    job sent predicts through the replica rule (`predict_trace`). Rank 1 checks late that its bank
    files are gone, while rank 0 would already fill the next checkpoint's (was: a file left behind
    under load)."""
    from hotsplit_runtime.hf.loader import load_model

    from tests.conftest import cpu_without_triton

    fp8_dir, deq_dir = fp8_checkpoint
    folders = {**checkpoints, "fp8": fp8_dir}
    placements = {n: _placement(tmp_path / f"{n}.json", load_model(f, cpu_without_triton()).layer_ids, 2, 2, seed=3)
                  for n, f in folders.items()}  # 2 replicas more than the 8 experts: 10 slots, 5 per rank
    job = _run(tmp_path, 2, folders, placement=placements, slow_check_rank=1)  # rank 1 checks its files late
    for name, got in job.items():
        folder, weights = (fp8_dir, deq_dir) if name == "fp8" else (checkpoints[name], None)
        want = reference_texts(folder, PROMPTS, NEW_TOKENS, weights)
        assert got["texts"] == want, name
        assert got["steps"] == max(got["own_steps"]) > min(got["own_steps"]), name  # one rank finished first
        assert got["loads_SLR"] == got["predicted_loads_SLR"], name
        assert got["hits_R"] == got["predicted_hits_R"], name
        assert sum(got["received_R"]) == np.asarray(got["loads_SLR"]).sum() > 0
        assert 0 < sum(got["hits_R"]) < sum(got["received_R"])  # hot and cold both served


def _placement(path, layers, ranks, redundant, seed):
    lay = random_layout(8, layers, Geometry(ranks, redundant), seed)
    save_placement(path, placement_doc(lay, 8))
    return str(path)


def test_ep4_with_replicas_swaps_and_a_rebalance_mid_run_equals_transformers(tmp_path, checkpoints):
    """ep 4 over the all-gather exchange, starting on the contiguous layout (2 experts per rank),
    a dynamic swap in every layer every 2 steps, and a live rebalance at step 3 to a placement
    with replicas (its gained experts served from the shared cold bank, then hot): the texts
    still equal transformers', with padded batches of 2 (padding is not sent)."""
    from hotsplit_runtime.hf.loader import read_config

    names = ("qwen3_moe", "gpt_oss")
    after = {}
    for n in names:
        cfg = read_config(checkpoints[n])
        layers = [i for i in range(cfg.num_hidden_layers) if n != "qwen3_moe" or i not in cfg.mlp_only_layers]
        after[n] = _placement(tmp_path / f"{n}.json", layers, 4, 4, seed=1)
    prompts = PROMPTS + [SENTENCES[1][:20], SENTENCES[2], SENTENCES[4][:9]]
    job = _run(tmp_path, 4, {n: checkpoints[n] for n in names}, exchange="allgather", batch=2, swap_every=2,
               rebalance_at=3, placement_after=after, prompts=prompts)
    for name, got in job.items():
        assert got["texts"] == reference_texts(checkpoints[name], prompts, NEW_TOKENS), name
        assert all(n > 0 for n in got["swaps_R"]), name  # every rank swapped mid-generation
        reps = got["rebalances"]
        assert [r["step"] for r in reps] == [3] and reps[0]["skipped"] is None and reps[0]["experts_moved"] > 0
