"""Stored precisions in the planning library: an expert's stored bytes, the measured errors of a
histogram's `quality` block, and the joint plan of hot set and precision with its bound."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import HistogramError, PlanError, UsageError
from hotsplit_cli.hotset.joint import _search as lagrangian_search
from hotsplit_cli.hotset.joint import brute_force_options, make_problem, plan_joint
from hotsplit_cli.hotset.precision_plan import auto_plan, pcie_bytes_per_step, routed_probs, uniform_choice
from hotsplit_cli.hotset.quality import load_quality, quality_from_doc
from hotsplit_cli.hotset.sizes import expert_bytes_per_rank, precision_bytes, uniform_precision
from hotsplit_cli.traffic.hist import load_hist
from tests.planning.quality_fixture import quality_block, write_quality_hist

FIXTURE = "tests/data/hist_quality_tiny.json"


def test_stored_bytes_of_deepseek_v2_lite_by_hand():
    rec = load_recipe("deepseek-v2-lite")  # hidden 2048, moe_intermediate 1408, bf16
    h, i = 2048, 1408
    assert expert_bytes_per_rank(rec) == expert_bytes_per_rank(rec, "native") == 3 * h * i * 2
    fp8_scales = 4 * (2 * math.ceil(i / 128) * math.ceil(h / 128) + math.ceil(h / 128) * math.ceil(i / 128))
    assert expert_bytes_per_rank(rec, "fp8") == 3 * h * i + fp8_scales
    assert expert_bytes_per_rank(rec, "mxfp4") == 3 * h * i // 2 + (2 * i * h // 32 + h * i // 32)
    assert precision_bytes(rec) == {p: expert_bytes_per_rank(rec, p) for p in ("native", "fp8", "mxfp4")}


def test_a_gpt_oss_expert_stored_natively_is_mxfp4_and_keeps_its_bf16_biases():
    rec = load_recipe("gpt-oss-120b")
    assert expert_bytes_per_rank(rec, "native") == expert_bytes_per_rank(rec, "mxfp4") == 13_236_480
    assert expert_bytes_per_rank(rec, "fp8") - 3 * 2880 * 2880 == 4 * 3 * 23 * 23 + (2 * 2880 + 2880) * 2


def test_mxfp4_is_refused_in_one_line_for_inputs_not_divisible_by_32():
    rec = load_recipe("deepseek-v2-lite")
    odd = dataclasses.replace(rec, model=dataclasses.replace(rec.model, hidden_size=2050))
    with pytest.raises(PlanError) as e:
        expert_bytes_per_rank(odd, "mxfp4")
    assert "hidden_size = 2050" in str(e.value) and "32" in str(e.value) and "\n" not in str(e.value)
    assert "mxfp4" not in precision_bytes(odd)  # the other precisions stay available
    expert_bytes_per_rank(odd, "fp8")


def test_the_precision_knob_follows_flag_env_recipe_default():
    assert resolve_knobs({}, {}, {}).precision == "native"
    assert resolve_knobs({"precision": "fp8"}, {}, {}).precision == "fp8"
    assert resolve_knobs({"precision": "fp8"}, {"HOTSPLIT_PRECISION": "mxfp4"}, {}).precision == "mxfp4"
    knobs = resolve_knobs({}, {"HOTSPLIT_PRECISION": "mxfp4"}, {"precision": "auto"})
    assert (knobs.precision, knobs.origin("precision")) == ("auto", "--precision")
    with pytest.raises(UsageError, match="HOTSPLIT_PRECISION: must be one of native, fp8, mxfp4, auto"):
        resolve_knobs({}, {"HOTSPLIT_PRECISION": "int4"}, {})
    with pytest.raises(UsageError, match="chosen by `hotsplit plan`"):
        uniform_precision(knobs)


def test_the_fixture_quality_block_reads_back():
    hist = load_hist(FIXTURE)
    q = load_quality(FIXTURE, hist.counts_LE.shape)
    assert set(q.error_LE) == {"fp8", "mxfp4"} and q.model["mxfp4"]["agreement"] == 0.96
    unrouted = hist.counts_LE == 0
    assert np.isnan(q.error_LE["fp8"][unrouted]).all() and not np.isnan(q.error_LE["fp8"][~unrouted]).any()
    assert (q.error_LE["mxfp4"][~unrouted] > q.error_LE["fp8"][~unrouted]).all()


def test_a_histogram_without_quality_has_none(tiny_hist):
    assert load_quality(tiny_hist, load_hist(tiny_hist).counts_LE.shape) is None


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.update(extra=1), "`quality.extra` is not a field"),
    (lambda b: b.pop("measured_on"), "`quality.measured_on` must say where"),
    (lambda b: b["expert_error"].update(int4=[]), "`quality.expert_error.int4` is not a measured precision"),
    (lambda b: b["expert_error"]["fp8"].pop(), "must have one row per MoE layer (4)"),
    (lambda b: b["expert_error"]["fp8"][2].pop(), "`quality.expert_error.fp8[2]` must list 32 errors"),
    (lambda b: b["expert_error"]["fp8"][1].__setitem__(3, -0.1), "`quality.expert_error.fp8[1][3]` is -0.1"),
    (lambda b: b["expert_error"]["mxfp4"][0].__setitem__(0, "x"), "`quality.expert_error.mxfp4[0][0]` is 'x'"),
    (lambda b: b["model"]["fp8"].update(agreement=1.5), "`quality.model.fp8.agreement` is 1.5"),
    (lambda b: b["model"]["fp8"].pop("tokens"), "`quality.model.fp8` must have exactly"),
])
def test_the_quality_reader_is_strict(mutate, message):
    counts = np.ones((4, 32))
    block = quality_block(counts)
    mutate(block)
    with pytest.raises(HistogramError) as e:
        quality_from_doc(json.loads(json.dumps(block)), counts.shape, "h.json")
    assert message in str(e.value) and str(e.value).startswith("h.json: ")


def _problem(rng, n: int):
    q = rng.random(n) * (rng.random(n) > 0.2)
    share = rng.random(n) * (q > 0)
    share = share / share.sum() if share.sum() else share
    bytes_p = np.array([4, 2, 1]) * int(rng.integers(1, 4))
    err = np.c_[np.zeros(n), rng.random(n) * 0.05, rng.random(n) * 0.2]
    err[rng.random((n, 3)) < 0.1] = np.nan  # not measured: only an expert without traffic may take it
    err[:, 0] = 0.0
    return make_problem(q, share, bytes_p, err, int(rng.integers(0, 4 * bytes_p[0] * n // 3 + 1)),
                        float(rng.random() * 0.1), rng.integers(0, 2, n) if rng.random() < 0.3 else None)


def _cost(problem, option_N):
    return float(problem.cost_NO[np.arange(len(option_N)), option_N].sum())


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6))
def test_brute_force_confirms_the_lp_bound_and_the_greedy_keeps_both_budgets(seed, n):
    problem = _problem(np.random.default_rng(seed), n)
    best = brute_force_options(problem)
    bound, greedy = lagrangian_search(problem)
    assert bound <= _cost(problem, best) * (1 + 1e-9) + 1e-12  # no plan reads fewer bytes than the bound
    assert _cost(problem, greedy) >= _cost(problem, best) - 1e-12
    rows = np.arange(n)
    assert problem.err_NO[rows, greedy].sum() <= problem.max_error * (1 + 1e-12)
    for g in range(problem.num_groups):
        assert problem.weight_O[greedy[problem.group_N == g]].sum() <= problem.budget
    plan = plan_joint(problem)  # few experts: certified by brute force
    assert plan.certified and plan.method == "brute-force" and plan.cold_bytes == pytest.approx(_cost(problem, best))


def test_the_joint_plan_on_many_experts_is_near_its_bound():
    rng = np.random.default_rng(3)
    n = 26 * 64
    q = rng.random(n) ** 4
    err = np.c_[np.zeros(n), rng.uniform(0.01, 0.03, n), rng.uniform(0.06, 0.18, n)]
    problem = make_problem(q, q / q.sum(), [17_301_504, 8_652_864, 4_596_736], err, 4 << 30, 0.05)
    plan = plan_joint(problem)
    assert plan.method == "lagrangian greedy" and plan.error <= 0.05
    assert plan.bound_cold_bytes <= plan.cold_bytes and plan.gap < 0.01
    assert plan.hot_bytes_G[0] <= 4 << 30


def test_auto_moves_fewer_bytes_than_every_uniform_precision_within_its_error_budget(tmp_path):
    """On a checkpoint-like histogram with measured errors, at several error budgets."""
    rec = load_recipe("deepseek-v2-lite")
    path = write_quality_hist(tmp_path / "h.json", "deepseek-v2-lite", windows=2, seed=1)
    hist = load_hist(path)
    quality = load_quality(path, hist.counts_LE.shape)
    budget = 4 << 30
    pi = routed_probs(hist.counts_LE, hist.top_k)
    uniform = {}
    for p in ("native", "fp8", "mxfp4"):
        from hotsplit_cli.hotset.planfile import plan_for_recipe

        choice = uniform_choice(hist.counts_LE, rec, p, quality, None)
        hot = plan_for_recipe(hist, rec, budget, p).hot_RLE[0]
        uniform[p] = (choice.expected_error, pcie_bytes_per_step(pi, hot, choice.sizes_LE, rec.traffic.batch))
    assert uniform["native"][1] > uniform["fp8"][1] > uniform["mxfp4"][1]
    for max_error in (0.01, 0.02, 0.05, 0.1):
        plan, choice = auto_plan(hist.counts_LE, hist.top_k, rec, budget, quality, max_error)
        auto_bytes = pcie_bytes_per_step(pi, plan.hot_RLE[0], choice.sizes_LE, rec.traffic.batch)
        assert choice.expected_error <= max_error and int(plan.hot_bytes_R[0]) <= budget
        within = [b for err, b in uniform.values() if err <= max_error]
        assert within and auto_bytes < min(within), (max_error, auto_bytes, uniform)


def test_auto_under_ep_fills_each_ranks_budget_with_its_own_experts(tmp_path):
    rec = load_recipe("tiny-ep4")
    path = write_quality_hist(tmp_path / "h.json", "tiny-ep4", windows=2)
    hist = load_hist(path)
    budget = 6 * expert_bytes_per_rank(rec, "fp8")
    plan, choice = auto_plan(hist.counts_LE, hist.top_k, rec, budget, load_quality(path, hist.counts_LE.shape), 0.05)
    owner = np.arange(32) // 8
    for r in range(4):
        assert not (plan.hot_RLE[r] & (owner != r)[None, :]).any()
        assert (choice.sizes_LE * plan.hot_RLE[r]).sum() == plan.hot_bytes_R[r] <= budget


def test_an_unreachable_error_budget_is_one_line():
    counts = np.ones((2, 4))
    err = np.full((8, 3), 0.1)  # even native is said to err: the least expected error is 0.1
    problem = make_problem(counts.ravel() / 4, counts.ravel() / 8, [4, 2, 1], err, 8, 0.05)
    with pytest.raises(PlanError) as e:
        plan_joint(problem)
    assert e.value.render() == ("error: error budget 0.05 is below the least expected error any plan can have (0.1); "
                                "raise --max-error")


def test_a_quality_block_written_by_to_doc_reads_back_the_same():
    """The writer `balance --model` uses (Quality.to_doc) and the reader agree, nulls included."""
    hist = load_hist(FIXTURE)
    q = load_quality(FIXTURE, hist.counts_LE.shape)
    again = quality_from_doc(json.loads(json.dumps(q.to_doc())), hist.counts_LE.shape, "h.json")
    assert again.measured_on == q.measured_on and again.model == q.model
    for p in q.error_LE:
        np.testing.assert_array_equal(again.error_LE[p], q.error_LE[p])  # nan where never routed, both sides
