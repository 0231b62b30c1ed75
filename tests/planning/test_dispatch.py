"""The replica rule and the EP predictions (numpy): what the runtime dispatches by."""

import numpy as np
import pytest

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.placement.algorithm import Geometry, Placement
from hotsplit_cli.placement.dispatch import (
    ReplicaMap,
    balancedness,
    choose_replicas,
    contiguous_placement,
    placed_hit_rates,
    predict_trace,
    token_shard,
)
from hotsplit_cli.placement.evaluate import evaluate, random_layout


def test_token_shards_cover_every_token_once():
    for T in range(0, 11):
        for R in range(1, 5):
            got = np.concatenate([np.arange(T)[token_shard(T, R, r)] for r in range(R)])
            assert got.tolist() == list(range(T))
            sizes = [token_shard(T, R, r).stop - token_shard(T, R, r).start for r in range(R)]
            assert max(sizes) - min(sizes) <= 1


def test_replicas_of_one_expert_differ_by_at_most_one_per_source():
    # Expert 0 has replicas in slots 0, 2, 5; experts 1, 2 one each.
    lay = Placement((1,), 3, np.array([[0, 1, 0, 2, 1, 0]]))
    reps = ReplicaMap.of(lay, 3)
    ids = np.zeros((7, 2), dtype=np.int64)
    ids[:, 1] = 1
    for src in range(3):
        slot = choose_replicas(ids, reps, 0, src)
        n0 = np.bincount(slot[:, 0], minlength=6)[[0, 2, 5]]
        assert n0.sum() == 7 and n0.max() - n0.min() <= 1
        assert set(slot[:, 1].tolist()) <= {1, 4}
        # The source's offset moves the remainder: source s starts at replica s mod 3.
        assert slot[0, 0] == [0, 2, 5][src % 3]


def test_padding_gets_no_slot_and_the_rule_is_deterministic():
    lay = random_layout(8, (1, 2), Geometry(4, 4), seed=3)
    reps = ReplicaMap.of(lay, 8)
    ids = np.random.default_rng(0).integers(-1, 8, size=(9, 3))
    a, b = choose_replicas(ids, reps, 1, 2), choose_replicas(ids.copy(), reps, 1, 2)
    assert (a == b).all() and (a[ids < 0] == -1).all()
    assert (lay.phy2log_LP[1][a[ids >= 0]] == ids[ids >= 0]).all()  # every slot holds its expert


def test_padding_never_counts_as_a_load_of_any_expert():
    """Padding ids interleaved with real ones leave every real assignment the replica it gets
    without them: padding shifts no expert's round-robin count (expert 0's included)."""
    lay = Placement((1,), 2, np.array([[0, 1, 0, 2]]))  # expert 0 in slots 0 and 2
    reps = ReplicaMap.of(lay, 3)
    ids = np.array([[0, -1], [0, 1], [-1, 0], [0, 2]])
    slot = choose_replicas(ids, reps, 0, 0)
    real = ids >= 0
    assert slot[real].tolist() == choose_replicas(ids[real][:, None], reps, 0, 0).ravel().tolist()
    assert slot[real].tolist() == [0, 2, 1, 0, 2, 3]  # expert 0's four assignments alternate 0, 2, 0, 2
    rng = np.random.default_rng(5)
    lay = random_layout(8, (1, 2), Geometry(4, 8), seed=1)
    reps = ReplicaMap.of(lay, 8)
    assert reps.logcnt_LE[0].max() > 1
    for src in range(4):
        ids = rng.integers(-1, 8, size=(11, 3))
        ids[rng.random(ids.shape) < 0.4] = -1
        ok = ids >= 0
        got = choose_replicas(ids, reps, 0, src)[ok]
        assert got.tolist() == choose_replicas(ids[ok][:, None], reps, 0, src).ravel().tolist()


def test_without_replicas_the_prediction_is_the_histogram_evaluation():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 8, size=(5, 2, 9, 2))  # [S, L, T, K]
    lay = contiguous_placement((1, 2), 8, 4)
    pred = predict_trace(ids, lay, 8)
    counts_SLE = np.stack([[np.bincount(ids[s, li].ravel(), minlength=8) for li in range(2)] for s in range(5)])
    assert np.isclose(pred.balancedness, evaluate(counts_SLE, lay).balancedness)
    assert pred.loads_SLR.sum() == ids.size


def test_hit_rates_and_balancedness():
    assert balancedness(np.array([[2, 2], [0, 0]])) == 1.0
    assert balancedness(np.array([[3, 1]])) == 2 / 3
    lay = contiguous_placement((1,), 4, 2)
    hot = np.zeros((2, 1, 4), dtype=bool)
    hot[0, 0, 0] = hot[1, 0, 3] = True
    rates = placed_hit_rates(np.array([[3.0, 1.0, 1.0, 1.0]]), lay, hot)
    assert np.allclose(rates, [0.75, 0.5])
    ids = np.array([[[[0, 1]], [[3, 2]]]]).reshape(1, 1, 2, 2)  # one step, two tokens
    pred = predict_trace(ids, lay, 4, hot)
    assert pred.hits_R.tolist() == [1, 1] and pred.loads_SLR.tolist() == [[[2, 2]]]
    assert pred.loads_SLR.dtype == pred.hits_R.dtype == np.int64  # counts: whole numbers in the JSON


def reference_replicas(ids_TK, placement: Placement, num_experts: int, layer: int, src: int) -> list:
    """The module docstring's rule with a counter per expert, in (token, k) order."""
    l2p, cnt = placement.log2phy_LEX(num_experts)[layer], placement.logcnt_LE(num_experts)[layer]
    seen: dict[int, int] = {}
    out = []
    for e in np.asarray(ids_TK).ravel().tolist():
        if e < 0:
            out.append(-1)
            continue
        i = seen.get(e, 0)
        seen[e] = i + 1
        out.append(int(l2p[e, (i + src) % cnt[e]]))
    return out


def test_choose_replicas_is_the_rule_in_token_order_and_padding_takes_no_turn():
    lay = random_layout(6, (0, 1), Geometry(4, 10), seed=2)  # 16 slots for 6 experts: many replicas
    reps = ReplicaMap.of(lay, 6)
    rng = np.random.default_rng(7)
    for trial in range(4):
        ids = rng.integers(-1, 6, size=(150, 4))  # long enough that an unstable sort would reorder ties
        for src in range(4):
            got = choose_replicas(ids, reps, trial % 2, src)
            assert got.ravel().tolist() == reference_replicas(ids, lay, 6, trial % 2, src)
    # a padded assignment before expert 0's first one does not move expert 0 to its second replica
    one = Placement((0,), 2, np.array([[0, 1, 0, 2]]))
    assert choose_replicas(np.array([[-1, 0]]), ReplicaMap.of(one, 3), 0, 0).tolist() == [[-1, 0]]


def test_the_replica_map_gives_each_slot_its_rank():
    reps = ReplicaMap.of(Placement((0,), 3, np.array([[0, 1, 0, 2, 1, 0]])), 3)
    assert reps.slots_per_rank == 2 and reps.num_ranks == 3
    assert reps.slot_rank(np.array([0, 1, 2, 3, 5])).tolist() == [0, 0, 1, 1, 2]


def test_contiguous_placement_by_name_and_its_refusal():
    lay = contiguous_placement((4, 5), 6, 3)
    assert (lay.method, lay.layers, lay.phy2log_LP.tolist()) == ("contiguous", (4, 5), [[0, 1, 2, 3, 4, 5]] * 2)
    with pytest.raises(PlanError) as exc:
        contiguous_placement((0,), 6, 4)
    assert exc.value.message == "ep=4 does not divide 6 experts"


def test_balancedness_without_traffic_below_one_and_of_stacked_steps():
    assert balancedness(np.zeros((3, 2))) == 1.0
    assert balancedness(np.array([[0.5, 0.25]])) == 0.75
    steps = np.array([[[3.0, 1.0, 2.0], [1.0, 1.0, 1.0]], [[0.0, 0.0, 6.0], [2.0, 2.0, 2.0]]])  # [S, L, R]
    assert balancedness(steps) == (2 + 1 + 2 + 2) / (3 + 1 + 6 + 2)


def test_placed_hit_rates_of_a_rank_without_hot_experts_or_traffic():
    lay = contiguous_placement((1,), 6, 3)
    hot = np.zeros((3, 1, 6), dtype=bool)
    hot[0, 0, 1] = True  # rank 0 serves expert 1 hot; ranks 1 and 2 nothing
    rates = placed_hit_rates(np.array([[0.5, 0.25, 0.0, 0.0, 3.0, 1.0]]), lay, hot)
    assert rates.tolist() == [0.25 / 0.75, 0.0, 0.0]  # rank 1 saw no traffic, rank 2 no hot expert
    hot[:, 0, :] = True
    assert placed_hit_rates(np.array([[0.5, 0.25, 0.0, 0.0, 3.0, 1.0]]), lay, hot).tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("seed", range(4))
def test_the_replica_map_holds_what_the_placement_puts_on_each_rank(seed):
    """An EP rank's model reads what it holds from the map its exchange routes with (a rebalance
    swaps the map): the same experts the placement puts on the rank."""
    lay = random_layout(6, (0, 1), Geometry(4, 10), seed=seed)
    replicas = ReplicaMap.of(lay, 6)
    for rank in range(4):
        assert np.array_equal(replicas.held_LE(rank), lay.held_LE(rank, 6))
