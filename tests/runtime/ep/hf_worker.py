"""One rank of the checkpoint EP tests (run under torchrun by tests/runtime/test_hf_ep.py): for
each checkpoint of the job, load it over the node's shared cold bank, generate this rank's share
of the prompts expert-parallel (runtime/hf/ep.py), and, on rank 0, write the job's texts, the
loads and hits each rank measured and what the recorded routing predicts for them.

argv: job.json out_dir. job.json: {"checkpoints": {name: folder}, "prompts": [...],
"max_new_tokens": n, "batch": b, "exchange": "a2a" | "allgather", "placement": path | null,
"swap_every": n (0: a static hot set), "rebalance_at": n (0: never; else the map moves to
`placement_after[name]` at that step)}. Writes out_dir/result.json on rank 0.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from hotsplit_runtime.distributed import launch, rebalance
from hotsplit_runtime.distributed.dispatch import make_exchange
from hotsplit_runtime.distributed.rank import EPRankContext
from hotsplit_runtime.distributed.rebalance import Rebalancer
from hotsplit_runtime.distributed.shared_bank import SharedAllocator, shm_prefix
from hotsplit_runtime.distributed.summary import gather_rows, gather_to_rank0
from hotsplit_runtime.hf.capture import capture
from hotsplit_runtime.hf.ep import EPCheckpoint, job_trace, load_shared, prompt_share
from hotsplit_runtime.hf.loader import load_tokenizer
from hotsplit_runtime.pinned import numa_policy_for

from hotsplit_cli.placement.dispatch import contiguous_placement, predict_trace
from hotsplit_cli.placement.file import load_placement
from hotsplit_cli.placement.rebalance_rule import RebalanceDecision
from tests.conftest import cpu_without_triton


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
    alloc = SharedAllocator(shm_prefix(f"{group.job}-{name}", group.node), creator=group.local_rank == 0,
                            numa=numa_policy_for("off", None))
    hm = load_shared(folder, info, group, alloc, torch.float32)
    E = hm.num_experts
    placement = (load_placement(cfg["placement"]) if cfg.get("placement")
                 else contiguous_placement(hm.layer_ids, E, group.world))
    ctx = EPRankContext(group, placement, E, exchange_mode=cfg["exchange"])
    exchange = make_exchange(cfg["exchange"], ctx.replicas, group.rank, group.world, control=group.control)
    ep = EPCheckpoint(hm, exchange, group.control)
    ep.held_LE = ctx.held_LE()
    ep.set_hot(ep.held_LE & (np.arange(E) % 2 == 0))
    return hm, ctx, ep, placement


def _generate(group, name, folder, cfg) -> dict | None:
    hm, ctx, ep, placement = _build(group, name, folder, cfg)
    tok = load_tokenizer(folder)
    every, at = cfg.get("swap_every", 0), cfg.get("rebalance_at", 0)
    rebalancer = Rebalancer(ctx, ep, group.control, hm.banks[0].expert_bytes, at) if at else None
    if at:
        _force_move(cfg["placement_after"][name])
    steps, swaps = [0], [0]

    def after_step(_=None):
        ep.end_step()
        steps[0] += 1
        if every and steps[0] % every == 0:
            swaps[0] += _rotate(ep)
        ep.publish_ready()
        if rebalancer is not None:
            rebalancer.after_step(steps[0])
            if steps[0] == at:
                rebalancer.maybe(steps[0])
    hot_start = ep.hot_LE()
    ids = capture(hm, tok, prompt_share(cfg["prompts"], group.world, group.rank), cfg["max_new_tokens"],
                  cfg["batch"], on_step=after_step)
    mine_done = steps[0]
    for forward in ep.lockstep(iter(())):  # the forwards above are done: empty ones while another generates
        forward()
        after_step()
    counters = ep.read_counters()
    texts = gather_to_rank0([tok.decode(x, skip_special_tokens=True) for x in ids], group.control)
    hits = gather_rows([counters["hits_L"].sum(), counters["assigned_L"].sum(), mine_done, swaps[0]], group.control)
    loads = gather_rows(np.asarray(ep.exchange.stats.loads, dtype=np.float64), group.control)
    hot_RLE = gather_rows(hot_start.astype(np.float64), group.control) > 0.5
    trace = job_trace(ep.trace_steps, group.control)
    if trace is None:
        return None
    pred = predict_trace(trace, placement, hm.num_experts, hot_RLE.reshape(group.world, *hot_start.shape))
    return {"texts": [t for r in texts for t in r], "steps": steps[0], "own_steps": hits[:, 2].tolist(),
            "swaps_R": hits[:, 3].tolist(), "hits_R": hits[:, 0].tolist(), "received_R": hits[:, 1].tolist(),
            "loads_SLR": loads.reshape(group.world, steps[0], -1).transpose(1, 2, 0).tolist(),
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
    if group.rank == 0:
        (out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
