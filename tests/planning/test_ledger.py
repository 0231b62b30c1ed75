"""`hotsplit ledger`: numbers checked by hand on a small recipe, the JSON shape, and the flags."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
import pytest
import yaml

from hotsplit_cli.analysis.ledger import (
    CommModel,
    a2a_ledger,
    ag_rs_bytes_per_layer,
    build_ledger,
    find_hot_experts,
    memory_ledger,
    with_ep,
)
from hotsplit_cli.cli import main
from hotsplit_cli.config.recipe import GIB, load_recipe, parse_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.sizes import bank_bytes_per_rank, dense_bytes_per_rank, expert_bytes_per_rank
from hotsplit_cli.traffic.hist import Histogram, save_hist

# A small deployment whose every number is worked out by hand below.
SMALL = {
    "name": "small",
    "model": {
        "hidden_size": 1024,
        "moe_intermediate_size": 512,
        "num_hidden_layers": 4,
        "first_k_dense": 1,
        "num_experts": 16,
        "top_k": 2,
        "expert_dtype": "bf16",
        "total_params": 100.0e6,
        "active_params": 40.0e6,
    },
    "parallel": {"tp": 2, "ep": 1},
    "hardware": {"gpu": "test", "gpu_mem_gib": 0.55, "kv_cache_gib": 0.25},
    "traffic": {"batch": 8},
    "hotsplit": {"vram_reserve_gib": 0.25},
}
# Hand computation (bf16, tp 2):
EXPERT_BYTES = 3 * 1024 * (512 // 2) * 2  # 1_572_864: one expert on one rank
EXPERT_FULL = 3 * 1024 * 512 * 2  # 3_145_728
ROUTED = 3 * 1024 * 512 * 16 * 3  # 75_497_472 parameters in 3 MoE layers
DENSE_BYTES = (100_000_000 - ROUTED) * 2 // 2  # 24_502_528 bytes per rank
ROOM_BYTES = 0.55 * GIB - DENSE_BYTES - 0.25 * GIB - 0.25 * GIB  # 29_184_563.2
HOT_EXPERTS = 18  # floor(29_184_563.2 / 1_572_864) = floor(18.55)


@pytest.fixture
def small_path(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def _small(**parallel):
    return parse_recipe({**SMALL, "parallel": {**SMALL["parallel"], **parallel}})


def _run(capsys, *args):
    rc = main(["ledger", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_library_sizes_are_the_hand_numbers():
    # sizes.py and the recipe, which the ledger builds on, against the hand computation above.
    rec, whole = _small(), _small(tp=1)
    assert (expert_bytes_per_rank(rec), expert_bytes_per_rank(whole)) == (EXPERT_BYTES, EXPERT_FULL)
    assert rec.model.routed_expert_params == ROUTED and rec.model.num_moe_layers == 3
    assert dense_bytes_per_rank(rec) == pytest.approx(DENSE_BYTES)
    assert bank_bytes_per_rank(rec) == EXPERT_BYTES * 16 * 3


def test_memory_ledger_by_hand():
    m = memory_ledger(_small(), reserve_gib=0.25)
    assert (m.tp, m.ep, m.ranks, m.num_moe_layers) == (2, 1, 2, 3)
    assert m.routed_expert_params == ROUTED
    assert m.dense_params == pytest.approx(100e6 - ROUTED)
    assert (m.expert_bytes, m.expert_bytes_full) == (EXPERT_BYTES, EXPERT_FULL)
    assert m.bank_bytes_total == EXPERT_FULL * 16 * 3
    assert m.bank_bytes_per_rank == EXPERT_BYTES * 16 * 3
    assert m.host_bytes_all_ranks == 2 * EXPERT_BYTES * 16 * 3  # both TP ranks' slices: every expert once
    assert m.experts_per_rank == 48
    assert m.dense_gib * GIB == pytest.approx(DENSE_BYTES)
    assert m.room_gib * GIB == pytest.approx(ROOM_BYTES)
    assert (m.hot_source, m.hot_gib) == ("auto", pytest.approx(ROOM_BYTES / GIB))
    assert (m.hot_experts, m.hot_fraction) == (HOT_EXPERTS, HOT_EXPERTS / 48)


def test_auto_budget_is_capped_at_the_bank_and_explicit_budget_counts_whole_experts():
    roomy = parse_recipe({**SMALL, "hardware": {**SMALL["hardware"], "gpu_mem_gib": 80.0}})
    m = memory_ledger(roomy, reserve_gib=0.25)
    assert m.hot_gib * GIB == m.bank_bytes_per_rank and m.hot_experts == 48 and m.hot_fraction == 1.0
    m = memory_ledger(_small(), reserve_gib=0.25, hot_gib=10 * EXPERT_BYTES / GIB + 1e-9, hot_source="flag")
    assert (m.hot_experts, m.hot_source) == (10, "flag")


def test_unknown_gpu_memory_leaves_the_budget_unknown():
    raw = {**SMALL, "hardware": {"gpu": "test"}}
    m = memory_ledger(parse_recipe(raw), reserve_gib=2.0)
    assert (m.gpu_mem_gib, m.room_gib, m.hot_gib, m.hot_experts, m.hot_source) == (
        None,
        None,
        None,
        None,
        "unknown",
    )


def test_all_to_all_ledger_by_hand_with_units():
    rec = with_ep(_small(), 4)
    a = a2a_ledger(rec, CommModel(tokens_per_step=8, act_bytes=2, link_gbps=100.0, cross_ratio=1.0))
    message = 8 * 2 * 1024 * 2  # tokens x top_k x hidden x bytes = 32_768 B
    per_layer = 2 * message * (3 / 4)  # dispatch + combine, 3 of 4 cards remote = 49_152 B
    seconds = per_layer / (100.0 * 1e9)  # GB/s = 1e9 B/s
    assert (a.message_bytes, a.remote_fraction, a.a2a_bytes_per_layer) == (32_768, 0.75, 49_152)
    assert a.a2a_ms_per_layer == pytest.approx(seconds * 1e3) == pytest.approx(4.9152e-4)
    assert a.a2a_ms_per_step == pytest.approx(3 * 4.9152e-4)
    # GB, not GiB: reading the link as GiB/s would give a 7% shorter time
    assert not math.isclose(a.a2a_ms_per_layer, per_layer / (100 * GIB) * 1e3, rel_tol=1e-3)
    assert (a.experts_per_card, a.expert_bytes_per_card) == (4, EXPERT_BYTES * 4 * 3)
    assert a.comm_share is None


def test_all_gather_reduce_scatter_bytes_by_hand():
    """Each card sends its tokens to the N - 1 others and gets their partial outputs back, whatever
    top_k and the placement: ag_rs / a2a = N / top_k."""
    a = a2a_ledger(with_ep(_small(), 4), CommModel(tokens_per_step=8, act_bytes=2, link_gbps=100.0))
    per_layer = 2 * 8 * 1024 * 2 * 3  # (gather + scatter) x tokens x hidden x bytes x (N - 1) = 98_304 B
    assert a.ag_rs_bytes_per_layer == per_layer == ag_rs_bytes_per_layer(8, 1024, 2, 4)
    assert a.ag_rs_ms_per_layer == pytest.approx(per_layer / (100.0 * 1e9) * 1e3)
    assert a.ag_rs_bytes_per_layer / a.a2a_bytes_per_layer == pytest.approx(4 / 2)  # N / top_k
    assert a2a_ledger(with_ep(_small(), 4), CommModel(8, cross_ratio=0.5)).ag_rs_bytes_per_layer == per_layer  # no
    # placement keeps a token off the other cards: every card gets every token
    assert a2a_ledger(_small(), CommModel(8)).ag_rs_bytes_per_layer == 0  # one card exchanges nothing


def test_cross_ratio_and_ep_one_scale_the_traffic():
    half = a2a_ledger(with_ep(_small(), 4), CommModel(8, cross_ratio=0.5))
    assert half.remote_fraction == 0.375 and half.a2a_bytes_per_layer == 24_576
    alone = a2a_ledger(_small(), CommModel(8))
    assert alone.a2a_bytes_per_layer == 0 and alone.a2a_ms_per_step == 0


def test_comm_share_flag_above_30_percent():
    rec = with_ep(_small(), 4)
    comm_ms = 3 * 4.9152e-4
    slow = build_ledger(rec, CommModel(8, link_gbps=100.0, step_ms=0.003), reserve_gib=0.25)
    assert slow.a2a.comm_share == pytest.approx(comm_ms / (0.003 + comm_ms))  # 0.3295
    assert [f.kind for f in slow.flags] == ["comm_share"]
    fast = build_ledger(rec, CommModel(8, link_gbps=100.0, step_ms=0.01), reserve_gib=0.25)
    assert fast.a2a.comm_share == pytest.approx(0.1285, abs=1e-4) and fast.flags == ()


def test_hot_experts_strictly_above_twice_the_layer_mean():
    counts_LE = np.array(
        [
            [10, 10, 10, 10, 10, 10, 10, 50],  # mean 15: 50 > 30 flagged
            [40, 10, 10, 10, 10, 0, 0, 0],
        ],  # mean 10: 40 > 20 flagged, 10 not
        dtype=float,
    )
    hot = find_hot_experts(counts_LE, (3, 5))
    assert [(h.layer, h.expert, h.count) for h in hot] == [(3, 7, 50.0), (5, 0, 40.0)]
    assert hot[0].layer_mean == 15.0 and hot[0].ratio == pytest.approx(50 / 15)
    exactly_twice = np.array([[20.0, 5.0, 5.0, 10.0]])  # mean 10, 20 is not above 2x
    assert find_hot_experts(exactly_twice, (1,)) == ()
    assert find_hot_experts(np.zeros((1, 4)), (1,)) == ()


def _write_hist(path, num_experts=16):
    counts = np.full((3, num_experts), 100.0)
    counts[0, 5] = 1000.0  # layer 1: mean 156.25, 1000 > 312.5
    counts[2, 9] = 300.0  # layer 3: mean 112.5, 300 > 225
    save_hist(
        path,
        Histogram(
            model="small",
            source="generated by tests/planning/test_ledger.py: fixed counts",
            top_k=2,
            tokens=1000,
            layers=(1, 2, 3),
            counts_LE=counts,
        ),
    )
    return path


def test_json_document_shape_and_numbers(small_path, tmp_path, capsys):
    hist = _write_hist(tmp_path / "hist.json")
    rc, out, err = _run(
        capsys,
        small_path,
        "--json",
        "--ep",
        4,
        "--tokens",
        8,
        "--link-gbps",
        100,
        "--step-ms",
        0.003,
        "--hist",
        hist,
    )
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) == {
        "schema",
        "recipe",
        "model",
        "memory",
        "assumptions",
        "a2a",
        "hot_experts",
        "flags",
        "histogram",
    }
    assert doc["schema"] == "hotsplit.ledger/1" and doc["recipe"] == "small"
    assert doc["assumptions"] == {
        "tokens_per_step": 8,
        "act_bytes": 2,
        "link_gbps": 100.0,
        "cross_ratio": 1.0,
        "step_ms": 0.003,
    }
    mem, a2a = doc["memory"], doc["a2a"]
    assert (mem["tp"], mem["ep"], mem["ranks"], mem["experts_per_rank"]) == (2, 4, 8, 12)
    assert mem["expert_bytes"] == EXPERT_BYTES and mem["bank_bytes_per_rank"] == EXPERT_BYTES * 4 * 3
    assert mem["hot_source"] == "auto" and mem["hot_experts"] == 12  # the whole (EP 4) bank fits
    assert (a2a["message_bytes"], a2a["a2a_bytes_per_layer"]) == (32_768, 49_152)
    assert a2a["a2a_ms_per_step"] == pytest.approx(3 * 4.9152e-4)
    assert [(h["layer"], h["expert"]) for h in doc["hot_experts"]] == [(1, 5), (3, 9)]
    assert [f["kind"] for f in doc["flags"]] == ["comm_share", "hot_expert", "hot_expert"]
    assert doc["histogram"] == str(hist)


def test_human_output_states_every_assumption_and_its_default(small_path, capsys):
    rc, out, err = _run(capsys, small_path, "--ep", 4)
    assert rc == 0 and err == ""
    for text in (
        "tokens per step per card (--tokens)",
        "activation bytes (--act-bytes)",
        "2 B",
        "450 GB/s (1e9 B/s, per direction)",
        "(N-1)/N x cross-ratio",
        "- (give --step-ms)",
        "hot experts it holds",
        "12 of 12",
        "model: bandwidth bound",
        "flags: none",
    ):
        assert text in out, text
    assert "8 x 2 x 1024 x 2 B = 32.8 kB" in out  # default tokens = the recipe's traffic.batch


def test_human_output_lists_flags(small_path, tmp_path, capsys):
    hist = _write_hist(tmp_path / "hist.json")
    rc, out, _ = _run(capsys, small_path, "--ep", 4, "--link-gbps", 100, "--step-ms", 0.003, "--hist", hist)
    assert rc == 0
    assert "[comm_share] All-to-All takes 33.0% of the step" in out
    assert "[hot_expert] layer 1 expert 5: 1000 assignments, 6.40x the layer mean (156.2)" in out


def test_explicit_hot_budget_over_gpu_memory_is_flagged(small_path, capsys):
    rc, out, _ = _run(capsys, small_path, "--json", "--hot-gib", "0.5")
    doc = json.loads(out)
    assert rc == 0 and doc["memory"]["hot_source"] == "flag" and doc["memory"]["hot_gib"] == 0.5
    assert [f["kind"] for f in doc["flags"]] == ["over_gpu"]


def test_no_room_is_flagged_not_an_error(tmp_path, capsys):
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "hardware": {**SMALL["hardware"], "gpu_mem_gib": 0.4}}))
    rc, out, _ = _run(capsys, path, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["memory"]["hot_experts"] == 0 and doc["memory"]["room_gib"] < 0
    assert [f["kind"] for f in doc["flags"]] == ["no_room"]


def test_hot_gib_env_is_used_and_flag_wins(small_path, capsys, monkeypatch):
    monkeypatch.setenv("HOTSPLIT_HOT_GIB", "0.01")
    _, out, _ = _run(capsys, small_path, "--json")
    assert json.loads(out)["memory"]["hot_source"] == "env"
    _, out, _ = _run(capsys, small_path, "--json", "--hot-gib", "0.02")
    assert json.loads(out)["memory"]["hot_gib"] == 0.02


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ep", "3"], "error: --ep: 3 does not divide model.num_experts (16)"),
        (["--ep", "0"], "error: --ep: must be >= 1, got 0"),
        (["--tokens", "0"], "error: --tokens: must be >= 1, got 0"),
        (["--act-bytes", "0"], "error: --act-bytes: must be in [1, 8], got 0"),
        (["--link-gbps", "0"], "error: --link-gbps: must be a positive number (GB/s), got 0.0"),
        (["--cross-ratio", "-1"], "error: --cross-ratio: must be >= 0, got -1.0"),
        (
            ["--ep", "4", "--cross-ratio", "2"],
            "error: --cross-ratio: 2.0 makes more than all assignments remote",
        ),
        (["--step-ms", "0"], "error: --step-ms: must be a positive number of ms, got 0.0"),
        (["--hot-gib", "-1"], "error: --hot-gib: must be >= 0, got -1.0"),
    ],
)
def test_bad_options_exit_2_with_the_flag_named(small_path, capsys, args, message):
    rc, out, err = _run(capsys, small_path, *args)
    assert rc == 2 and out == ""
    assert err.startswith(message), err


def test_histogram_of_another_model_is_refused(small_path, tmp_path, capsys):
    hist = _write_hist(tmp_path / "hist.json", num_experts=32)
    rc, out, err = _run(capsys, small_path, "--hist", hist)
    assert rc == 1 and out == ""
    assert err.startswith(f"error: {hist}: 32 experts per layer but recipe 'small' has 16")


def test_missing_histogram_file_is_an_error(small_path, tmp_path, capsys):
    rc, out, err = _run(capsys, small_path, "--hist", tmp_path / "nope.json")
    assert rc == 1 and out == "" and "no such file" in err


def test_with_ep_refuses_library_callers_too():
    with pytest.raises(UsageError, match="does not divide"):
        with_ep(_small(), 5)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "mimo-v2-flash", "qwen3-235b-a22b"])
def test_shipped_recipes_render(name, capsys):
    rc, out, err = _run(capsys, name, "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["memory"]["hot_source"] == "auto" and 0 < doc["memory"]["hot_fraction"] < 1


def test_runs_without_torch(small_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now raises ImportError
    rc, out, _ = _run(capsys, small_path, "--json")
    assert rc == 0 and json.loads(out)["recipe"] == "small"


def test_deepseek_v3_host_memory_for_the_cold_banks(capsys):
    m = memory_ledger(load_recipe("deepseek-v3"), reserve_gib=2.0)
    # 8 TP ranks x 14848 expert slices of 5,506,368 B (fp8 + block scales): 609.15 GiB on the host
    assert m.host_bytes_all_ranks == 8 * 14848 * 5_506_368
    assert main(["ledger", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "Host memory" in out and "all 8 ranks (tp 8 x ep 1), summed over their hosts" in out
    assert "609.15 GiB" in out


def test_ep_flag_rank_count_and_host_memory_wording(capsys):
    rc, out, err = _run(capsys, "deepseek-v3", "--ep", "8")
    assert rc == 0 and err == ""
    # --ep keeps the recipe's tp 8: 64 ranks, which no single host holds
    assert "tp 8 x ep 8 = 64 ranks" in out.splitlines()[0]
    assert "one host" not in out
    row = next(x for x in out.splitlines() if x.startswith("all 64 ranks"))
    assert row.split() == ["all", "64", "ranks", "(tp", "8", "x", "ep", "8),", "summed", "over", "their", "hosts",
                           "609.15", "GiB"]


def test_hot_budget_row_shows_a_small_budget_in_its_unit(small_path, capsys):
    rc, out, _ = _run(capsys, small_path, "--hot-gib", "0.001")
    assert rc == 0
    assert next(x for x in out.splitlines() if x.startswith("hot budget (flag)")).split()[-2:] == ["1.02", "MiB"]


def test_a_runs_exchange_is_predicted_at_its_allocated_size_and_mean_shard():
    """The ledger's bytes for a run's exchange: the recipe's formula at the hidden size and
    activation bytes the run allocated, scaled to its mean (fractional) tokens per rank."""
    from hotsplit_cli.analysis.ledger import exchange_prediction

    r = with_ep(load_recipe("tiny"), 4)
    a2a = exchange_prediction(r, "a2a", 3.5, 32, 4)
    m = r.model
    assert a2a["predicted_bytes_per_layer"] == pytest.approx(2 * 3.5 * m.top_k * 32 * 4 * 3 / 4)
    ag = exchange_prediction(r, "allgather", 3.5, 32, 4)
    assert ag["predicted_bytes_per_layer"] == pytest.approx(ag_rs_bytes_per_layer(3.5, 32, 4, 4))
    assert ag["predicted_by"].startswith("ledger: 2 x tokens x hidden") and a2a["mode"] == "a2a"
    whole = a2a_ledger(dataclasses.replace(r, model=dataclasses.replace(m, hidden_size=32)),
                       CommModel(tokens_per_step=4, act_bytes=4))
    assert a2a["predicted_ms_per_layer"] == pytest.approx(whole.a2a_ms_per_layer * 3.5 / 4)
