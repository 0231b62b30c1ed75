"""The worked examples of docs/ computed by the code they describe, figure by figure."""

from __future__ import annotations

import numpy as np

from hotsplit_cli.hotset.planner import plan_hot_set


def test_docs_planner_md_worked_example():
    """docs/planner.md: greedy stops at 94 of 156 = 60.3%, certified by brute force; the LP bound
    takes 2/6 of (0, 2) for 106 = 67.9%, a 7.7-point gap."""
    counts = np.array([[40.0, 20.0, 36.0], [54.0, 6.0, 0.0]])
    sizes = np.array([[4, 4, 6], [6, 6, 6]])
    plan = plan_hot_set(counts, sizes, 12)
    assert np.argwhere(plan.hot_RLE[0]).tolist() == [[0, 0], [1, 0]]
    assert plan.hot_bytes_R.tolist() == [10]
    assert (round(100 * plan.hit_rate, 1), round(100 * plan.greedy_hit_rate, 1)) == (60.3, 60.3)
    assert plan.hit_rate == 94 / 156 and plan.bound_hit_rate == 106 / 156
    assert plan.certified and plan.methods == ("greedy (brute-force-certified)",)
    assert (round(100 * plan.bound_hit_rate, 1), round(100 * plan.gap, 1)) == (67.9, 7.7)


def test_docs_placement_md_golden_case_loads():
    """docs/placement.md's golden case: the EPLB README's layout has busiest-GPU loads 156 and
    179.5, hotsplit's hierarchical layout the same, its flat layout 139 and 172."""
    from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts
    from hotsplit_cli.placement.evaluate import rank_loads
    from tests.planning.test_place import README_PHY2LOG, README_WEIGHT

    def peaks(p):
        return rank_loads(README_WEIGHT[None], p).max(axis=2)[0].tolist()

    assert peaks(Placement((0, 1), 8, README_PHY2LOG)) == [156.0, 179.5]
    assert peaks(place_experts(README_WEIGHT[None], (0, 1), Geometry(8, 4, num_nodes=2, num_groups=4))) == [
        156.0, 179.5]
    assert peaks(place_experts(README_WEIGHT[None], (0, 1), Geometry(8, 4))) == [139.0, 172.0]


def test_docs_precision_md_worked_example():
    """docs/precision.md: three experts, budget 4 bytes, the joint plan at three error budgets and
    uniform fp8 at E = 0.02 reading twice the bytes."""
    from hotsplit_cli.hotset.joint import make_problem, plan_joint

    share = [0.6, 0.3, 0.1]
    err = [[0, 0.02, 0.10], [0, 0.01, 0.20], [0, 0.03, 0.05]]
    expected = {0.0: ([0, 0, 0], [1, 0, 0], 1.6, 0.0), 0.02: ([1, 1, 2], [1, 1, 0], 0.1, 0.02),
                0.2: ([1, 2, 2], [1, 1, 1], 0.0, 0.077)}
    for max_error, (precision, hot, nbytes, error) in expected.items():
        plan = plan_joint(make_problem(share, share, [4, 2, 1], err, 4, max_error))
        assert plan.precision_N.tolist() == precision and plan.hot_N.astype(int).tolist() == hot
        assert (round(plan.cold_bytes, 6), round(plan.error, 6)) == (nbytes, error)
        assert round(plan.bound_cold_bytes, 6) == nbytes and plan.certified
    uniform_fp8 = plan_joint(make_problem(share, share, [2], [[0.02], [0.01], [0.03]], 4, 0.02))
    assert (uniform_fp8.hot_N.tolist(), round(uniform_fp8.cold_bytes, 6)) == ([True, True, False], 0.2)
