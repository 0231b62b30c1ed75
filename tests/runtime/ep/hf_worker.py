"""One rank of the checkpoint EP tests (run under torchrun by tests/runtime/test_hf_ep.py): for
each checkpoint of the job, load it over the node's shared cold bank, generate this rank's share
of the prompts expert-parallel (runtime/distributed/checkpoint.py), and, on rank 0, write the job's texts, the
loads and hits each rank measured and what the recorded routing predicts for them.

argv: job.json out_dir. job.json: {"checkpoints": {name: folder}, "prompts": [...],
"max_new_tokens": n, "batch": b, "exchange": "a2a" | "allgather", "placement": {name: path} | null
(null: contiguous),
"swap_every": n (0: a static hot set), "rebalance_at": n (0: never; else the map moves to
`placement_after[name]` at that step), "precision": {name: stored precision} (default native),
"slow_check_rank": r (that rank checks its bank files 2 s late; default none)}.
Writes out_dir/result.json on rank 0.
"""

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from hotsplit_runtime.distributed import launch, rebalance
from hotsplit_runtime.distributed.apply import expert_parallel
from hotsplit_runtime.distributed.checkpoint import EPCheckpoint, job_trace
from hotsplit_runtime.distributed.rebalance import Rebalancer
from hotsplit_runtime.distributed.shared_bank import SharedAllocator, shm_prefix
from hotsplit_runtime.distributed.summary import gather_rows, gather_to_rank0
from hotsplit_runtime.hf.capture import Generation
from hotsplit_runtime.hf.loader import load_model, load_tokenizer
from hotsplit_runtime.hf.steps import CheckpointMoE
from hotsplit_runtime.pinned import numa_policy_for
from hotsplit_runtime.ranks import Rank

from hotsplit_cli.placement.dispatch import ReplicaMap, contiguous_placement, predict_trace
from hotsplit_cli.placement.file import load_placement
from hotsplit_cli.placement.rebalance_rule import RebalanceDecision
from tests.conftest import cpu_without_triton
from tests.runtime.ep.harness import assert_group_gone


def _rotate(ep: EPCheckpoint) -> int:
    """A swap in every layer whatever the counts (the swap rule has its own tests): the first hot
    expert makes room for the first expert held here cold."""
    hot, held = ep.hot_LE(), ep.held_LE
    moves = {}
    for li in range(hot.shape[0]):
        out, into = np.flatnonzero(hot[li]), np.flatnonzero(held[li] & ~hot[li])
        if len(out) and len(into):
            moves[li] = [(int(out[0]), int(into[0]))]
    ep.begin_swaps(moves)
    return len(moves)


def _force_move(target_path: str) -> None:
    """The rebalance rule, made to move to the placement at `target_path` (the rule has its own tests)."""
    target = load_placement(target_path)

    def decide(fit, judge, current, live):
        return RebalanceDecision(target, None, live, live)
    rebalance.decide_rebalance = decide


def _build(group, name, folder, cfg):
    info = cpu_without_triton()
    numa = numa_policy_for("off", None)
    allocator = SharedAllocator(pin=info.pinned, numa=numa, prefix=shm_prefix(group.job, group.node),
                                creator=group.local_rank == 0)
    loading = Rank(group.rank, group.world, info, numa, allocator, group=group)  # the run's below
    precision = cfg.get("precision", {}).get(name, "native")
    hm = loading.on_bank(lambda a: load_model(folder, info, allocator=a, precision=precision))
    E = hm.num_experts
    placement = (load_placement(cfg["placement"][name]) if cfg.get("placement")
                 else contiguous_placement(hm.layer_ids, E, group.world))
    ctx = dataclasses.replace(loading, placement=placement, replicas=ReplicaMap.of(placement, E),
                              exchange_mode=cfg["exchange"])
    tok = load_tokenizer(folder)
    prompts = ctx.share(cfg["prompts"])
    ep, source = expert_parallel(CheckpointMoE(hm, info),
                                 Generation(hm, tok, prompts, cfg["max_new_tokens"], cfg["batch"]), ctx)
    for bank, hot_E in zip(ep.banks, ep.held_LE & (np.arange(E) % 2 == 0), strict=True):
        bank.set_hot(hot_E)
    return ctx, ep, source, placement


def _generate(group, name, folder, cfg) -> dict | None:
    ctx, ep, source, placement = _build(group, name, folder, cfg)
    every, at = cfg.get("swap_every", 0), cfg.get("rebalance_at", 0)
    rebalancer = Rebalancer(placement, ep, group.control, ep.banks[0].expert_bytes, at) if at else None
    if at:
        _force_move(cfg["placement_after"][name])
    steps, swaps, own = 0, 0, 0
    hot_start = ep.hot_LE()
    for forward in source.steps():  # the one loop's part that matters here; its windows have their own tests
        ep.publish_ready()
        ep.step(forward)
        steps += 1
        own += forward != ep.empty_forward
        if every and steps % every == 0:
            swaps += _rotate(ep)
        if rebalancer is not None:
            rebalancer.after_step(steps)
            if steps == at:
                rebalancer.maybe(steps)
    counters = ep.read_counters()
    # Every rank mapped the node's bank files and the filler then unlinked them. Checked before the
    # collectives below: past them rank 0 may already fill the next checkpoint's files, of the same names.
    if group.rank == cfg.get("slow_check_rank"):
        time.sleep(2.0)  # the slowest rank of a loaded machine, made deterministic
    paths = ctx.allocator.paths
    assert paths and not any(os.path.exists(p) for p in paths), paths
    texts = gather_to_rank0(source.texts(), group.control)
    hits = gather_rows([counters["hits_L"].sum(), counters["assigned_L"].sum(), own, swaps], group.control)
    loads = gather_rows(np.asarray(ep.exchange.stats.loads, dtype=np.float64), group.control)
    hot_RLE = gather_rows(hot_start.astype(np.float64), group.control) > 0.5
    trace = job_trace(ep.trace_steps, group.control)
    if trace is None:
        return None
    pred = predict_trace(trace, placement, ep.hm.num_experts, hot_RLE.reshape(group.world, *hot_start.shape))
    return {"texts": [t for r in texts for t in r], "steps": steps, "own_steps": hits[:, 2].tolist(),
            "swaps_R": hits[:, 3].tolist(), "hits_R": hits[:, 0].tolist(), "received_R": hits[:, 1].tolist(),
            "loads_SLR": loads.reshape(group.world, steps, -1).transpose(1, 2, 0).tolist(),
            "predicted_loads_SLR": pred.loads_SLR.tolist(), "predicted_hits_R": pred.hits_R.tolist(),
            "rebalances": [r.to_doc() for r in rebalancer.reports] if rebalancer else []}


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    group = launch.join()
    try:
        results = {name: _generate(group, name, folder, cfg) for name, folder in cfg["checkpoints"].items()}
    finally:
        launch.leave()
    assert_group_gone()
    if group.rank == 0:
        (out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
