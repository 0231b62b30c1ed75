"""Whether prefetch pays: the step-time model by hand, and the slot choice either way."""

from __future__ import annotations

import pytest

from hotsplit_cli.core.errors import PlanError
from hotsplit_cli.hotset.prefetch_plan import LinkModel, plan_prefetch, step_ms
from hotsplit_cli.traffic.predict import MeasuredRecall

HALF = MeasuredRecall(0.5, 0.0, 4, 100)


def test_step_time_by_hand():
    link = LinkModel(num_layers=2, read_ms=1.0, copy_ms=1.0, compute_ms=3.0)
    # c = 2 per layer; without: 2 x (3 + 2) = 10 ms
    assert step_ms(4.0, 0, "layer", link, HALF) == 10.0
    # 1 slot: staged = min(1, 0.5 x 2) = 1, useful 1; layer 1 = (2 - 1) x 1 + max(3, 1) = 4; layer 0 = 5
    assert step_ms(4.0, 1, "layer", link, HALF) == 9.0
    # a shared pool of 2 lends each layer 1: the same
    assert step_ms(4.0, 2, "shared", link, HALF) == 9.0
    # one wasted copy per useful: staged = min(4, 0.5 x 2 x 2) = 2, useful 1: still hidden under 3 ms
    assert step_ms(4.0, 4, "layer", link, MeasuredRecall(0.5, 1.0, 4, 100)) == 9.0


def test_slots_are_planned_where_compute_hides_the_copies():
    link = LinkModel(2, 1.0, 1.0, compute_ms=3.0)
    got = plan_prefetch({0: [4.0, 8.0], 1: [4.2, 8.2]}, [1, 2], link, "layer", HALF)
    assert got.slots == 1 and got.rows[0] == {"batch": 1, "compute_ms": 3.0, "without_ms": 10.0, "with_ms": 9.2,
                                                  "best_slots": 1}
    assert got.reason.startswith("1 staging slots: ") and "at recall 0.50" in got.reason


def test_a_link_bound_step_plans_no_slots_and_says_why():
    link = LinkModel(2, read_ms=1.0, copy_ms=1.0, compute_ms=0.01)  # compute hides nothing: batch 1 on PCIe
    got = plan_prefetch({0: [4.0], 1: [4.2], 2: [4.4]}, [1], link, "layer", HALF)
    assert got.slots == 0 and got.rows[0]["with_ms"] == got.rows[0]["without_ms"]
    assert "no slot count saves 1% of step time: a layer computes for 0.010 ms" in got.reason
    unmeasured = plan_prefetch({0: [4.0], 1: [4.2]}, [1], LinkModel(2, 1.0, 1.0, None), "layer", HALF)
    assert unmeasured.slots == 0 and "compute per layer is not measured" in unmeasured.reason
    unknown = plan_prefetch({0: [4.0], 1: [4.0]}, [1], link, "layer", None, "no lookahead in the histogram")
    assert unknown.slots == 0 and unknown.reason == ("0 staging slots: the predictor's recall is unknown "
                                                     "(no lookahead in the histogram)")


def test_cold_counts_must_cover_zero_slots_and_every_batch():
    with pytest.raises(PlanError, match="cold counts at 0 slots"):
        plan_prefetch({1: [4.0]}, [1], LinkModel(2, 1.0, 1.0, 1.0), "layer", HALF)


def test_batch_one_on_a_pcie_link_plans_no_slots_and_long_compute_does():
    """deepseek-v2-lite's experts (recipes/deepseek-v2-lite.yaml, 16.5 MiB bf16) over a PCIe 4.0 x16
    link read at 25 GB/s (the recipe's RTX 4090): 0.69 ms a read. At batch 1 a layer computes
    for under 10 us (the figure llama.cpp reports for a ~1 MB expert), so a staged copy hides
    under nothing; with 2 ms of compute per layer (a large batch) staging pays."""
    from hotsplit_cli.config.recipe import load_recipe
    from hotsplit_cli.hotset.sizes import expert_bytes_per_rank

    read_ms = expert_bytes_per_rank(load_recipe("deepseek-v2-lite")) / 25e9 * 1e3
    recall = MeasuredRecall(0.65, 0.4, 24, 8320)  # the co-activation table's recall at 24 guesses (docs/prefetch.md)
    cold = {s: [26 * 4.5 + 0.1 * s] for s in (0, 1, 2, 4, 8)}  # carving a slot adds a little cold traffic
    link_bound = plan_prefetch(cold, [1], LinkModel(26, read_ms, read_ms, compute_ms=0.01), "shared", recall)
    assert link_bound.slots == 0 and "no slot count saves 1% of step time" in link_bound.reason
    long = plan_prefetch(cold, [256], LinkModel(26, read_ms, read_ms, compute_ms=2.0), "shared", recall)
    assert long.slots == 8 and long.rows[0]["with_ms"] < 0.9 * long.rows[0]["without_ms"]
