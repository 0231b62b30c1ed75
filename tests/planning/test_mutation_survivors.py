"""Checks added for behaviours a mutation run (docs/testing.md) found untested: the exact text of
errors users read, a digest of a file longer than one read, and the masks a cold-path mode returns."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.core.jsonio import read_json_doc
from hotsplit_cli.hotset.coldpath import ColdRates, split_cold
from hotsplit_cli.traffic.hist import file_sha256


def test_a_wrong_schema_is_one_line_naming_both_schemas_and_what_to_do(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"schema": "hotsplit.plan/3"}')
    with pytest.raises(InputFileError) as exc:
        read_json_doc(path, "plan", versions=(1, 2))
    assert exc.value.render() == (f"error: {path}: schema 'hotsplit.plan/3' is not hotsplit.plan/1 or "
                                  "hotsplit.plan/2; was it written by another tool or a newer hotsplit?")


def test_file_sha256_is_the_digest_of_every_byte_across_reads(tmp_path):
    """Longer than one 1 MiB read, and not a whole number of them."""
    data = np.random.default_rng(0).integers(0, 256, (3 << 20) + 12345, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(b"")
    assert file_sha256(path) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("mode, on_cpu", [("gpu", [False, False, False]), ("cpu", [True, True, True]),
                                          ("split", [True, False, False])])
def test_every_mode_returns_a_boolean_mask_that_selects_experts(mode, on_cpu):
    """The runtime indexes expert ids with `to_cpu_N`: it must be a bool mask in every mode."""
    split = split_cold([1e9, 1e9, 1e9], [1, 1, 1], ColdRates(1.0, ((1, 1.0),)), mode)
    assert split.to_cpu_N.dtype == bool and split.to_cpu_N.tolist() == on_cpu
    assert np.array([7, 8, 9])[split.to_cpu_N].tolist() == [e for e, c in zip([7, 8, 9], on_cpu, strict=True) if c]


def test_an_unknown_cold_path_names_the_choices():
    with pytest.raises(UsageError) as exc:
        split_cold([1.0], [1], ColdRates(1.0, ()), "both")
    assert exc.value.message == "cold_path: must be one of gpu, cpu, split, got 'both'"


@pytest.mark.parametrize("raw, want", [
    ("1", True), ("0", False), ("true", True), ("false", False), ("on", True), ("off", False),
    (" TRUE ", True), ("Off", False), ("oN", True),
])
def test_a_boolean_knob_takes_every_documented_spelling_from_the_environment(raw, want):
    from hotsplit_cli.config.knobs import resolve_knobs

    assert resolve_knobs({}, {"HOTSPLIT_DYNAMIC": raw}).dynamic is want


@pytest.mark.parametrize("raw, want", [(True, True), (False, False), (1, True), (0, False)])
def test_a_boolean_knob_takes_yaml_booleans_and_0_or_1(raw, want):
    from hotsplit_cli.config.knobs import resolve_knobs

    assert resolve_knobs({"dynamic": raw}, {}).dynamic is want


@pytest.mark.parametrize("knob, raw, message", [
    ("dynamic", 2, "must be 0 or 1, got 2"), ("dynamic", "yes", "must be 0 or 1, got 'yes'"),
    ("dyn_steps", 2.5, "must be an integer, got 2.5"), ("dyn_margin", "fast", "must be a finite number, got 'fast'"),
    ("dyn_steps", " 7 ", None),
])
def test_bad_knob_values_are_refused_naming_the_kind(knob, raw, message):
    from hotsplit_cli.config.knobs import resolve_knobs

    if message is None:
        assert resolve_knobs({knob: raw}, {}).dyn_steps == 7
        return
    with pytest.raises(UsageError) as exc:
        resolve_knobs({knob: raw}, {})
    assert exc.value.message.endswith(message)


def test_the_lp_bound_adds_the_fraction_of_the_first_item_that_does_not_fit():
    from hotsplit_cli.hotset.planner import lp_bound

    # by value per byte: 6/2, 5/5, 4/8; 2 + 5 bytes fit whole, 3 of the 8 bytes of the last
    assert lp_bound(np.array([5.0, 4.0, 6.0]), np.array([5, 8, 2]), 10) == pytest.approx(6 + 5 + 4 * 3 / 8)


@pytest.mark.parametrize("values, sizes, budget, chosen", [
    ([10.0, 9.0, 1.0], [5, 6, 2], 7, [True, False, True]),  # the leftover 2 bytes hold the last item exactly
    ([10.0, 1.0], [8, 5], 5, [False, True]),  # the best per byte does not fit; the next fills the budget exactly
])
def test_greedy_takes_an_item_that_fills_the_room_exactly(values, sizes, budget, chosen):
    from hotsplit_cli.hotset.planner import greedy_select

    assert greedy_select(np.array(values), np.array(sizes), budget).tolist() == chosen


def test_a_histogram_round_trips_every_field_and_writes_whole_counts_as_integers(tmp_path):
    import json

    from hotsplit_cli.traffic.hist import Histogram, load_hist, save_hist

    counts = np.array([[3.0, 0.0, 7.0], [1.0, 2.0, 5.0]])
    h = Histogram(model="m", source="generated in tests", top_k=2, tokens=9, layers=(3, 5), counts_LE=counts,
                  created="2026-01-01T00:00:00Z", windows_WLE=np.stack([counts, counts]), steps_per_window=4)
    save_hist(tmp_path / "h.json", h)
    doc = json.loads((tmp_path / "h.json").read_text())
    assert doc["counts"] == [[3, 0, 7], [1, 2, 5]] and all(type(x) is int for row in doc["counts"] for x in row)
    assert doc["created"] == "2026-01-01T00:00:00Z" and doc["windows"]["steps_per_window"] == 4
    back = load_hist(tmp_path / "h.json")
    assert (back.model, back.source, back.top_k, back.tokens, back.layers, back.created, back.steps_per_window) == (
        "m", "generated in tests", 2, 9, (3, 5), "2026-01-01T00:00:00Z", 4)
    halves = Histogram(model="m", source="s", top_k=2, tokens=1, layers=(0,), counts_LE=np.array([[0.5, 2.0]]))
    save_hist(tmp_path / "f.json", halves)
    assert json.loads((tmp_path / "f.json").read_text())["counts"] == [[0.5, 2.0]]


@pytest.mark.parametrize("expert_bytes, message", [
    (0, "expert bytes must be > 0"), (1.5, "expert bytes must be whole numbers, got 1.5"),
    (float("inf"), "expert bytes must be whole numbers, got inf"), ([4, 4], "expert bytes of shape (2,) do not match"),
])
def test_bad_expert_sizes_are_refused(expert_bytes, message):
    from hotsplit_cli.core.errors import PlanError
    from hotsplit_cli.hotset.planner import plan_hot_set

    with pytest.raises(PlanError) as exc:
        plan_hot_set(np.ones((3, 4)), expert_bytes, 10)
    assert exc.value.message.startswith(message)
    assert plan_hot_set(np.ones((3, 4)), 2.0, 4).hot_RLE.sum() == 2  # a whole float is taken


def test_an_ep_plan_sums_every_ranks_greedy_value_and_bound_and_is_certified():
    from hotsplit_cli.hotset.planner import contiguous_owner, plan_hot_set

    counts = np.array([[8.0, 3.0, 5.0, 1.0]])  # rank 0 owns experts 0-1, rank 1 experts 2-3
    plan = plan_hot_set(counts, 2, 3, rank_of_LE=contiguous_owner(1, 4, 2), num_ranks=2)  # one expert per rank
    assert plan.certified and plan.methods == ("top-n", "top-n")
    assert plan.hit_rate == plan.greedy_hit_rate == pytest.approx((8 + 5) / 17)
    assert plan.bound_hit_rate == pytest.approx((8 + 3 / 2 + 5 + 1 / 2) / 17)  # half of the next one each


def test_two_expert_sizes_are_not_solved_as_top_n():
    from hotsplit_cli.hotset.planner import select

    sel = select(np.array([10.0, 9.0, 9.0]), np.array([4, 2, 2]), 4)  # 9 + 9 beats the largest count
    assert sel.chosen_N.tolist() == [False, True, True] and sel.method != "top-n" and sel.certified


def test_brute_force_decides_up_to_its_limit_of_positive_items():
    from hotsplit_cli.hotset.planner import BRUTE_FORCE_MAX_ITEMS, select

    n = BRUTE_FORCE_MAX_ITEMS
    values = np.arange(n, 0, -1, dtype=np.float64)
    sizes = np.where(np.arange(n) % 2 == 0, 2, 3)
    assert select(values, sizes, 7).method.endswith(("brute-force", "brute-force-certified)"))
    more = select(np.append(values, 0.5), np.append(sizes, 2), 7)
    assert "dp" in more.method


def test_no_cpu_rate_means_no_cpu_work():
    rates = ColdRates(1.0, ())
    assert rates.cpu_gbps(4) == 0.0
    split = split_cold([1e9] * 20, [1] * 20, rates)
    assert not split.to_cpu_N.any() and split.seconds == 20.0
