"""When a live rebalance is worth applying (numpy only): the rule the runtime's rebalancer
(runtime/distributed/rebalance.py) applies at every `eplb_steps`, and a replay of a routing
trace under that rule, so that a prediction and a run take the same decisions.

A placement fitted on the counts it is then scored on always looks better than the map in force
(it was chosen for them): on stationary traffic a refit on a few steps fits their noise, and
the next steps are served worse than by the map it replaced. So a candidate is judged on counts
it did not see: the procedure "fit on the earlier counts" is scored on the latest ones (the
latest half of the counts since the map last moved, the fit being the half before), and the
map moves only when that held-out score beats the current map's on the same counts by
REBALANCE_MARGIN. While the map is kept its counts keep adding up, so each later look judges on
more traffic and noise weighs less. The map then applied is fitted on all of those counts (the
same procedure, one step on), and its predicted balancedness is the held-out score, not its
in-sample one.

Shape letters: S = steps, L = MoE layers, T = tokens per step (all ranks), K = top_k, E = experts,
R = ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts
from hotsplit_cli.placement.dispatch import ReplicaMap, balancedness, choose_replicas, predict_trace, token_shard
from hotsplit_cli.placement.evaluate import evaluate

EPLB_SKIP_ABOVE = 0.95  # live balancedness at or above which the map is kept without a look
REBALANCE_MARGIN = 0.01  # held-out balancedness a candidate must gain over the current map
NOISE_SIGMAS = 1.5  # ... and at least this many times the noise of the counts it is judged on


@dataclass(frozen=True)
class RebalanceDecision:
    placement: Placement | None  # the map to switch to; None keeps the current one
    kept: str | None  # why the current map was kept (None when it moves)
    current_held_out: float  # the current map's balancedness on the latest counts
    candidate_held_out: float | None  # a map fitted on the earlier counts, on the latest ones


def chunk_ends(eplb_steps: int) -> tuple[int, ...]:
    """Steps into an interval at which its counts close a chunk: its middle and its end (one
    chunk, the whole interval, when `eplb_steps` is 1)."""
    half = eplb_steps // 2
    return (half, eplb_steps) if half else (eplb_steps,)


def split_chunks(chunks_CLE: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Counts (float [L, E]) since the map last moved, cut into the earlier chunks (the fit) and
    the later ones (the judge): the judge is the latest half, the fit what came before."""
    n = len(chunks_CLE)
    zero = np.zeros_like(chunks_CLE[0])
    return sum(chunks_CLE[:n // 2], zero), sum(chunks_CLE[n // 2:], zero)


def move_margin(judge_LE: np.ndarray, num_ranks: int) -> float:
    """The held-out gain a move needs: REBALANCE_MARGIN, or the noise of a balancedness measured
    on n assignments per (layer, rank), about 1 / sqrt(n), when that is larger (a Poisson count's
    relative spread, NOISE_SIGMAS times: two maps scored on a few steps differ that much by chance)."""
    n = float(judge_LE.sum()) / (judge_LE.shape[0] * num_ranks)
    return max(REBALANCE_MARGIN, NOISE_SIGMAS / np.sqrt(n)) if n > 0 else 1.0


def decide_rebalance(fit_LE: np.ndarray, judge_LE: np.ndarray, current: Placement, live: float) -> RebalanceDecision:
    """Keep `current` or move to a map fitted on fit + judge counts (float [L, E] each), by the
    rule of the module docstring. `live`: the balancedness of the interval's exchanges."""
    E = fit_LE.shape[1]
    recent_LE = fit_LE + judge_LE
    cur_held = evaluate(judge_LE[None], current).balancedness if judge_LE.any() else 1.0
    if not recent_LE.any():
        return RebalanceDecision(None, "no traffic", cur_held, None)
    if live >= EPLB_SKIP_ABOVE:
        return RebalanceDecision(None, f"balancedness {live:.3f} >= {EPLB_SKIP_ABOVE}", cur_held, None)
    if not fit_LE.any() or not judge_LE.any():
        return RebalanceDecision(None, "no counts yet to judge a new map on", cur_held, None)
    geo = Geometry(current.num_ranks, current.num_physical - E)
    candidate = place_experts(fit_LE[None], current.layers, geo)
    cand_held = evaluate(judge_LE[None], candidate).balancedness
    need = move_margin(judge_LE, current.num_ranks)
    if cand_held < cur_held + need:
        return RebalanceDecision(None, f"a new map would reach {cand_held:.3f} on unseen counts, the current one "
                                       f"{cur_held:.3f} (a move needs +{need:.3f})", cur_held, cand_held)
    return RebalanceDecision(place_experts(recent_LE[None], current.layers, geo), None, cur_held, cand_held)


@dataclass(frozen=True)
class RebalanceReport:
    step: int
    skipped: str | None  # why the map was kept (None: it moved)
    before: float  # live balancedness of the exchanges since the last rebalance
    predicted_before: float  # the current map on the latest counts it did not see (evaluation by evaluate.py)
    predicted_after: float  # the moved map's held-out prediction (kept: the current map's own)
    achieved_after: float | None  # the next window of exchanges (set when it closes)
    experts_moved: int  # slots refilled, all ranks
    bytes_moved_R: list[int]  # real expert bytes each rank copied into its hot slots
    ms: float  # the rebalance on rank 0: reduce, placement, publication and the copies it waited for
    steps_disturbed: int = 0
    worse: bool = False  # a move after which the achieved balancedness fell below `before`

    def to_doc(self) -> dict:
        return asdict(self)



@dataclass(frozen=True)
class RebalanceReplay:
    loads_SLR: np.ndarray  # int64: each exchange's rank loads under the map in force at that step
    decisions: list[tuple[int, RebalanceDecision]]  # (step after which it was taken, decision)

    @property
    def balancedness(self) -> float:
        S, L, R = self.loads_SLR.shape
        return balancedness(self.loads_SLR.reshape(S * L, R))


def step_loads(ids_LTK: np.ndarray, replicas: ReplicaMap) -> np.ndarray:
    """int64 [L, R]: the routed assignments each rank receives in one step by the replica rule."""
    L, T, _ = ids_LTK.shape
    R = replicas.num_ranks
    loads = np.zeros((L, R), dtype=np.int64)
    for src in range(R):
        shard = ids_LTK[:, token_shard(T, R, src)]
        for li in range(L):
            slot = choose_replicas(shard[li], replicas, li, src)
            loads[li] += np.bincount(replicas.slot_rank(slot[slot >= 0]), minlength=R)
    return loads


def replay_rebalancing(ids_SLTK: np.ndarray, start: Placement, num_experts: int, eplb_steps: int
                       ) -> RebalanceReplay:
    """A trace served as a live-rebalancing run serves it: a decision after every `eplb_steps`
    steps but the last, from the counts and exchanges since the previous one."""
    ids_SLTK = np.asarray(ids_SLTK)
    S, L = ids_SLTK.shape[:2]
    placement, replicas = start, ReplicaMap.of(start, num_experts)
    loads = np.zeros((S, L, start.num_ranks), dtype=np.int64)
    counts = np.zeros((S, L, num_experts))
    for li in range(L):
        for s in range(S):
            ids = ids_SLTK[s, li].reshape(-1)
            counts[s, li] = np.bincount(ids[ids >= 0], minlength=num_experts)
    decisions, since, chunk_from, chunks = [], 0, 0, []
    ends = chunk_ends(eplb_steps) if eplb_steps else ()
    for s in range(S):
        loads[s] = step_loads(ids_SLTK[s], replicas)
        done = s + 1
        if eplb_steps and (done - 1) % eplb_steps + 1 in ends:  # a chunk of the interval closes here
            chunks.append(counts[chunk_from:done].sum(axis=0))
            chunk_from = done
        if eplb_steps and done % eplb_steps == 0 and done < S:
            live = balancedness(loads[since:done].reshape(-1, start.num_ranks))
            d = decide_rebalance(*split_chunks(chunks), placement, live)
            decisions.append((done, d))
            if d.placement is not None:
                placement, replicas, chunks = d.placement, ReplicaMap.of(d.placement, num_experts), []
            since = done
    return RebalanceReplay(loads, decisions)


def refill_moves(hot_LE: np.ndarray, held_LE: np.ndarray, share_LE: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """A rank's swaps after its map moved: each hot slot of an expert it no longer holds (`held_LE`,
    bool [L, E] by the new map) goes to the strongest expert (`share_LE`) it holds cold, ties by
    id; every other slot stays put. {layer: [(out, in), ...]}, layers without a move left out."""
    moves: dict[int, list[tuple[int, int]]] = {}
    for li in range(hot_LE.shape[0]):
        lost = np.flatnonzero(hot_LE[li] & ~held_LE[li])
        cand = np.flatnonzero(held_LE[li] & ~hot_LE[li])
        cand = cand[np.lexsort((cand, -share_LE[li, cand]))]  # strongest first, ties by id
        pairs = [(int(o), int(i)) for o, i in zip(lost, cand, strict=False)]
        if pairs:
            moves[li] = pairs
    return moves


def trace_predictions(ids_SLTK: np.ndarray, placement: Placement, num_experts: int, hot_RLE: np.ndarray,
                      eplb_steps: int, moved: bool) -> tuple[float | None, np.ndarray | None]:
    """What replaying an EP run's trace predicts: its balancedness (with live rebalancing's moves,
    replayed by the same rule, when `eplb_steps`) and each rank's hit rate [R] while the layout
    it began with holds (None once a rebalance `moved` it)."""
    pred = None if moved else predict_trace(ids_SLTK, placement, num_experts, hot_RLE)
    if eplb_steps:
        bal = replay_rebalancing(ids_SLTK, placement, num_experts, eplb_steps).balancedness
    else:
        bal = None if pred is None else pred.balancedness
    return bal, None if pred is None else pred.hit_rate_R

