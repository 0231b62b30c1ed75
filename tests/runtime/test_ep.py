"""Expert parallelism on CPU ranks (gloo on loopback): every token's output equals the
single-process all-resident reference MoE, whatever the placement, replicas, swaps and cold path.
Each job is a few tiny steps, bounded in time, and leaves no process behind."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import numpy as np
import pytest
import torch
from hotsplit_runtime.moe import MoEGeometry, ReferenceMoE, make_layer_weights
from hotsplit_runtime.precision import stored_format
from hotsplit_runtime.selftest import assert_matches
from hotsplit_runtime.stored_run import stored_run

from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.placement.algorithm import Geometry, place_experts
from hotsplit_cli.placement.evaluate import random_layout
from hotsplit_cli.placement.file import placement_doc, save_placement

from .ep.harness import (
    EP_TEST_DEVICE,
    JOB_TIMEOUT_S,
    REPO,
    TAG,
    env_for_ranks,
    kill_tagged,
    run_job,
    tiny_ep_recipe,
    torchrun,
)

WORKER = str(REPO / "tests" / "runtime" / "ep" / "worker.py")


# The CPU runs the float32 reference's own arithmetic. A GPU runs in bfloat16: the reference then
# computes in float32 on the bfloat16 weights, and outputs match at bf16's tolerance (selftest).
RUN_DTYPE = torch.float32 if EP_TEST_DEVICE == "cpu" else torch.bfloat16
TOL = 2e-5


def _reference(recipe_path):
    """The recipe's MoE all resident, its experts dequantised from the precision the run stores,
    with the weights the run made (in its dtype), computed in float32."""
    rec = load_recipe(recipe_path)
    precision = rec.knobs.get("precision", "native")
    geom = stored_run(rec, precision, rec.run.scale).geom
    layers = [make_layer_weights(geom, rec.run.seed * 1000 + li, RUN_DTYPE, stored_format(precision))
              for li in range(rec.model.num_moe_layers)]
    as_float = [dataclasses.replace(lw, w13_EIH=lw.w13_EIH.float(), w2_EHI=lw.w2_EHI.float(),
                                    shared_w13=None if lw.shared_w13 is None else lw.shared_w13.float(),
                                    shared_w2=None if lw.shared_w2 is None else lw.shared_w2.float())
                for lw in layers]
    return rec, ReferenceMoE(as_float, torch.device("cpu"))


def _assert_step(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    if RUN_DTYPE == torch.float32:
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=lambda m: f"{where}: {m}")
    else:
        try:
            assert_matches(got, want, RUN_DTYPE)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None


def _check_against_reference(recipe_path, out_dir, ranks):
    rec, ref = _reference(recipe_path)
    K = rec.model.top_k
    steps = 0
    for r in range(ranks):
        d = np.load(out_dir / f"rank{r}.npz")
        for s in range(d["x"].shape[0]):
            ids = torch.from_numpy(d["ids"][s].astype(np.int64))
            w = torch.full(ids.shape, 1.0 / K)
            want = ref.step(torch.from_numpy(d["x"][s]), ids, w)
            _assert_step(torch.from_numpy(d["out"][s]), want, f"rank {r} step {s}")
            steps += 1
    assert steps == ranks * rec.run.steps
    return json.loads((out_dir / "job.json").read_text())


@pytest.mark.parametrize("precision", ["fp8", "mxfp4"])
def test_two_ranks_at_a_stored_precision_equal_the_reference_on_dequantised_weights(tmp_path, precision):
    """Each rank's banks store its experts at the run's precision; swaps at every window keep it."""
    # moe_intermediate 32: whole mxfp4 groups of 32 inputs in the down projection; a budget of 1-2
    # stored experts per layer (fp8 3084 bytes, mxfp4 1632)
    over = {"hotsplit.precision": precision, "model.moe_intermediate_size": 32, "hotsplit.hot_gib": 4000 / 2**30}
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2, **over)
    done = run_job(torchrun(2, [WORKER, str(recipe), str(tmp_path)]))
    assert done.returncode == 0, done.stderr[-3000:]
    job = _check_against_reference(recipe, tmp_path, 2)
    assert job["summary"]["swaps"] > 0


def _placement_file(path, recipe_path, ranks, kind, redundant, seed=0):
    rec = load_recipe(recipe_path)
    L, E = rec.model.num_moe_layers, rec.model.num_experts
    geo = Geometry(ranks, redundant)
    if kind == "random":
        lay = random_layout(E, rec.model.moe_layer_ids, geo, seed)
    else:
        counts = np.random.default_rng(seed).gamma(0.5, size=(1, L, E)) + 0.01
        lay = place_experts(counts, rec.model.moe_layer_ids, geo)
    save_placement(path, placement_doc(lay, E))
    return str(path)


CASES = [
    # ranks, placement (None: contiguous), redundant, cold_path, ep_exchange
    pytest.param(2, None, 0, "gpu", "a2a", id="ep2-contiguous"),
    pytest.param(4, "random", 4, "gpu", "a2a", id="ep4-random-redundant"),
    pytest.param(4, "fitted", 4, "split", "a2a", id="ep4-fitted-redundant-split"),
    pytest.param(2, "random", 0, "split", "a2a", id="ep2-random-split"),
    pytest.param(4, "fitted", 4, "split", "allgather", id="ep4-fitted-redundant-split-allgather"),
]


@pytest.mark.parametrize("ranks, kind, redundant, cold_path, exchange", CASES)
def test_every_token_equals_the_reference(tmp_path, ranks, kind, redundant, cold_path, exchange):
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", ranks, **{"hotsplit.cold_path": cold_path,
                                                             "hotsplit.ep_exchange": exchange})
    args = [WORKER, str(recipe), str(tmp_path)]
    if kind is not None:
        args.append(_placement_file(tmp_path / "pl.json", recipe, ranks, kind, redundant, seed=ranks))
    done = run_job(torchrun(ranks, args))
    assert done.returncode == 0, done.stderr[-3000:]
    job = _check_against_reference(recipe, tmp_path, ranks)
    # Swaps happened (the worker swaps at every window), on the ranks. own experts only.
    assert job["summary"]["swaps"] > 0
    assert len(job["figures"]["ranks"]) == ranks
    # batch x top_k x steps x layers
    assert sum(r["assignments"] for r in job["figures"]["ranks"]) == ranks * 5 * 2 * 6 * 2
    assert job["figures"]["exchange"]["mode"] == exchange
    for r in job["figures"]["ranks"]:  # where each rank's cold work went, as a single rank reports it
        paths = r["cold_paths"]
        if cold_path == "gpu":
            assert paths is None
            continue
        assert paths["mode"] == "split" and 0 < paths["layers_with_cpu"] <= paths["layers"] <= 6 * 2  # layer calls
        assert paths["gpu"]["experts"] + paths["cpu"]["experts"] > 0
        assert paths["cpu_share"] == paths["cpu"]["experts"] / (paths["gpu"]["experts"] + paths["cpu"]["experts"])


def test_allgather_equals_the_reference_and_a2a_on_uneven_shards(tmp_path):
    """Both exchanges on the same trace (7 tokens a step: shards of 4 and 3, so the all-gather
    pads), on a random placement with redundant replicas: every token of both equals the
    reference, and loads, hit rates, swaps, cold reads and balancedness are the same, equal to
    the trace's prediction. Each mode's bytes are what leaves a rank: the all-gather's the
    padded shard (4 tokens) each way, the a2a's the rows sent to other ranks."""
    from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
    from hotsplit_cli.traffic.trace import save_trace

    trace = save_trace(tmp_path / "t.npz", synthetic_trace(zipf_shares(2, 8, 1.2, seed=4), (1, 2), steps=6,
                                                           batch=7, top_k=2, seed=4))
    jobs = {}
    for mode in ("a2a", "allgather"):
        out = tmp_path / mode
        out.mkdir()
        recipe = tiny_ep_recipe(out / "r.yaml", 2, **{"hotsplit.ep_exchange": mode, "traffic.kind": "trace",
                                                      "traffic.path": str(trace)})
        pl = _placement_file(tmp_path / "pl.json", recipe, 2, "random", 2, seed=9)
        done = run_job(torchrun(2, [WORKER, str(recipe), str(out), pl]))
        assert done.returncode == 0, done.stderr[-3000:]
        jobs[mode] = _check_against_reference(recipe, out, 2)
    a2a, ag = jobs["a2a"]["figures"], jobs["allgather"]["figures"]
    assert [np.load(tmp_path / "allgather" / f"rank{r}.npz")["x"].shape[1] for r in range(2)] == [4, 3]
    for key in ("assignments", "hit_rate", "swaps", "cold_reads"):
        assert [r[key] for r in ag["ranks"]] == [r[key] for r in a2a["ranks"]], key
    assert ag["balancedness"] == a2a["balancedness"] == ag["predicted_balancedness"]
    assert [r["ranks"] for r in jobs["allgather"]["records"]] == [r["ranks"] for r in jobs["a2a"]["records"]]
    row = 32 * RUN_DTYPE.itemsize  # hidden x the run's dtype (float32 on a CPU, bfloat16 on a GPU)
    assert ag["exchange"]["measured_bytes_per_layer"] == 2 * 4 * row * (2 - 1)  # padded to the larger shard
    assert ag["exchange"]["predicted_bytes_per_layer"] == 2 * 3.5 * row * (2 - 1)  # the ledger at the mean shard
    assert a2a["exchange"]["mode"] == "a2a" and ag["exchange"]["mode"] == "allgather"


def test_hot_experts_stay_on_their_ranks(tmp_path):
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 4)
    pl = _placement_file(tmp_path / "pl.json", recipe, 4, "random", 4, seed=7)
    done = run_job(torchrun(4, [WORKER, str(recipe), str(tmp_path), pl]))
    assert done.returncode == 0, done.stderr[-3000:]
    from hotsplit_cli.placement.file import load_placement

    lay = load_placement(pl)
    S = lay.slots_per_rank
    for r in range(4):
        hot = np.load(tmp_path / f"rank{r}.npz")["hot"]  # [steps, L, E]
        for li in range(hot.shape[1]):
            held = set(lay.phy2log_LP[li, r * S:(r + 1) * S].tolist())
            assert set(np.flatnonzero(hot[:, li].any(axis=0)).tolist()) <= held


def test_four_ranks_hold_the_cold_bank_once(tmp_path):
    """Each rank maps and reads the node's whole cold bank, yet the node holds its pages once:
    the ranks' proportional shares (Pss) add up to one bank, their resident views to four."""
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 4, **{"run.steps": 2})
    env = env_for_ranks()
    env["EP_TEST_MEMORY"] = "1"
    done = run_job(torchrun(4, [WORKER, str(recipe), str(tmp_path)]), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rec = load_recipe(recipe)
    geom = MoEGeometry.from_recipe(rec, 1.0)
    bank = rec.model.num_moe_layers * rec.model.num_experts * geom.blob_elems * 4  # float32 on a CPU
    mem = [json.loads((tmp_path / f"mem{r}.json").read_text()) for r in range(4)]
    for m in mem:
        assert m["mappings"] == rec.model.num_moe_layers  # one shared file per layer, mapped by every rank
        assert bank <= m["size"] < bank + 4 * rec.model.num_moe_layers * 4096
        assert m["rss"] >= bank  # each rank reads every expert ...
        assert m["private"] == 0  # ... and owns none of the pages
    assert sum(m["rss"] for m in mem) >= 4 * bank
    assert sum(m["pss"] for m in mem) <= bank * 1.01 + 4 * 4096 * rec.model.num_moe_layers  # held once


def test_two_nodes_of_two_ranks_share_a_bank_per_node(tmp_path):
    """Two torchrun launches on loopback (--nnodes 2), as two nodes would run: every token equals
    the reference, and each node's two ranks map that node's cold bank, not the other's."""
    import socket

    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 4, **{"run.steps": 4})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = env_for_ranks()
    env["EP_TEST_MEMORY"] = "1"


    nodes = []
    try:
        for node in range(2):
            args = torchrun(2, [WORKER, str(recipe), str(tmp_path)])
            args = [a for a in args if a != "--standalone"]
            args[3:3] = ["--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
            nodes.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                          cwd=REPO))
        results = [p.communicate(timeout=JOB_TIMEOUT_S) for p in nodes]
    finally:
        kill_tagged(env[TAG])
    for p, (_, err) in zip(nodes, results, strict=True):
        assert p.returncode == 0, err[-3000:]
    _check_against_reference(recipe, tmp_path, 4)
    mem = [json.loads((tmp_path / f"mem{r}.json").read_text()) for r in range(4)]
    node_of = [{f.split("-node")[1].split("-")[0] for f in m["files"]} for m in mem]
    assert node_of == [{"0"}, {"0"}, {"1"}, {"1"}]
    assert mem[0]["files"] == mem[1]["files"] and mem[2]["files"] == mem[3]["files"]
    for pair in ((0, 1), (2, 3)):
        assert sum(mem[r]["pss"] for r in pair) <= mem[pair[0]]["size"] * 1.01  # once per node


@pytest.mark.parametrize("exchange", ["a2a", "allgather"])
def test_a_rebalance_mid_run_still_equals_the_reference(tmp_path, exchange):
    """eplb_steps 2 on a skewed contiguous start: the ranks move to a new placement mid-run
    (gained experts served from the shared cold bank, then hot), and every token still equals the
    reference, in both exchanges (each dispatches by the map the step read)."""
    # 32 experts and 40 tokens per rank and step: enough room and counts that a held-out look
    # finds a map better than the contiguous start beyond the counts' noise, so the map moves.
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 4, **{"hotsplit.eplb_steps": 2, "traffic.skew": 1.0,
                                                        "traffic.batch": 40, "model.num_experts": 32,
                                                        "hotsplit.ep_exchange": exchange})
    done = run_job(torchrun(4, [WORKER, str(recipe), str(tmp_path)]))
    assert done.returncode == 0, done.stderr[-3000:]
    job = _check_against_reference(recipe, tmp_path, 4)
    reps = job["figures"]["rebalances"]
    assert [r["step"] for r in reps] == [2, 4]  # not after the last step
    done_reps = [r for r in reps if r["skipped"] is None]
    assert done_reps and sum(r["experts_moved"] for r in done_reps) > 0, reps
    for r in done_reps:
        assert r["predicted_after"] >= r["predicted_before"] - 1e-9
        assert len(r["bytes_moved_R"]) == 4
        # CPU copies land at once; a GPU's run on the swap stream, and a step may start before they land
        assert r["steps_disturbed"] == 0 if EP_TEST_DEVICE == "cpu" else r["steps_disturbed"] >= 0
    assert done_reps[0]["achieved_after"] is not None or done_reps[0]["step"] == 4


def test_lookahead_staging_at_ep2_equals_the_reference_and_each_rank_stages_what_it_serves(tmp_path):
    """Each rank guesses from its own tokens' next router and stages the cold experts it holds
    (the contiguous placement: rank r holds experts 4r..4r+3); every token's output equals the
    reference, swaps at every window included, and no shared cold bank file is left behind."""
    import glob

    before = set(glob.glob("/dev/shm/hotsplit-*"))
    recipe = tiny_ep_recipe(tmp_path / "r.yaml", 2, **{"hotsplit.prefetch": "lookahead", "hotsplit.prefetch_slots": 2,
                                                       "hotsplit.hot_gib": 6 * 3072 / 2**30})
    done = run_job(torchrun(2, [WORKER, str(recipe), str(tmp_path)]))
    assert done.returncode == 0, done.stderr[-3000:]
    job = _check_against_reference(recipe, tmp_path, 2)
    ranks = job["figures"]["ranks"]
    assert all(r["prefetch"]["predictor"] == "lookahead" for r in ranks)
    assert sum(r["prefetch"]["prefetched"] for r in ranks) >= sum(r["prefetch"]["useful"] for r in ranks) > 0
    assert sum(r["prefetch"]["staged_hits"] for r in ranks) > 0  # staged experts served received tokens
    assert not set(glob.glob("/dev/shm/hotsplit-*")) - before  # none of this job's left (others' may come and go)
