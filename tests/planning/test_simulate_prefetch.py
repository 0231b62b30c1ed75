"""`simulate --prefetch trace`: the staging rows, agreeing with the library replay, and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotsplit_cli.analysis.prefetch import StagingConfig, replay_staging
from hotsplit_cli.hotset.planner import plan_hot_set
from hotsplit_cli.traffic.predict import fit_predictor, token_members_NLE
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import load_trace, save_trace

ONE = 3 * 256 * 128 * 2  # recipes/tiny.yaml's bf16 expert


@pytest.fixture
def traces(tmp_path):
    shares = zipf_shares(4, 32, 1.1, seed=0)
    replay = synthetic_trace(shares, (1, 2, 3, 4), steps=40, batch=8, top_k=4, drift_every=20, seed=0)
    fit = synthetic_trace(shares, (1, 2, 3, 4), steps=40, batch=8, top_k=4, seed=1)
    return save_trace(tmp_path / "replay.npz", replay), save_trace(tmp_path / "fit.npz", fit)


def simulate(cli, replay, *extra):
    return cli("simulate", "--trace", replay, "--recipe", "tiny", "--policies", "static", "--dyn-steps", "10",
               "--hot-gib", str(40 * ONE / 2**30), *extra)


def test_static_row_is_the_replay_with_the_pool_carved_from_the_budget(cli, traces):
    replay, fit = traces
    r = simulate(cli, replay, "--prefetch", "trace", "--prefetch-fit", fit, "--prefetch-slots", "2",
                 "--prefetch-pool", "layer", "--prefetch-guesses", "6", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)["prefetch"]
    assert (doc["slots"], doc["pool"], doc["guesses"], doc["hot_slots"]) == (2, "layer", 6, 40 - 2 * 3)
    tr = load_trace(replay, 32)
    counts = tr.counts_SLE(32)
    hot = plan_hot_set(counts[:10].sum(axis=0), ONE, (40 - 6) * ONE).hot_RLE[0]  # first window, carved
    member = token_members_NLE(tr, 32)
    predictor = fit_predictor("cooccur", token_members_NLE(load_trace(fit, 32), 32))
    want = replay_staging(counts, member, [(0, 40, hot, 0)], predictor, StagingConfig(2, "layer", 6))
    assert doc["policies"]["static"] == want.to_doc(ONE, float(counts.sum()))
    assert doc["policies"]["static"]["useful"] > 0 and set(doc["policies"]) == {"static", "dynamic"}
    assert doc["held_out_recall"]["available"] and doc["held_out_recall"]["origins"] == [2, 3]  # windows of 10


def test_prefetch_off_adds_nothing_and_human_output_has_the_table(cli, traces):
    replay, _ = traces
    r = simulate(cli, replay, "--json")
    assert r.code == 0 and "prefetch" not in json.loads(r.out)
    r = simulate(cli, replay, "--prefetch", "trace")
    assert r.code == 0, r.err
    assert "fitted on the trace's first window" in r.out and "policy + staging" in r.out
    assert "per-token recall at 12 guesses on held-out windows" in r.out


@pytest.mark.parametrize("extra, code, msg", [
    (["--prefetch", "lookahead"], 2, "prefetch lookahead: the next layer's router cannot be replayed from a trace"),
    (["--prefetch", "sometimes"], 2, "--prefetch: must be one of off, lookahead, trace, auto"),
    (["--prefetch", "trace", "--prefetch-slots", "-1"], 2, "--prefetch-slots: must be >= 0"),
    (["--prefetch", "trace", "--prefetch-pool", "ring"], 2, "--prefetch-pool: must be one of layer, shared"),
    (["--prefetch", "trace", "--prefetch-guesses", "0"], 2, "--prefetch-guesses: must be >= 1"),
    (["--prefetch", "trace", "--prefetch-pool", "layer", "--prefetch-slots", "20"], 1,
     "60 staging slots (11.25 MiB) exceed the hot budget of 7.50 MiB"),
    (["--prefetch", "trace", "--prefetch-fit", "missing.npz"], 1, "no such file"),
])
def test_refusals_are_one_line_and_write_nothing(cli, traces, tmp_path, extra, code, msg):
    png = tmp_path / "never.png"
    r = simulate(cli, traces[0], "--plot", png, *extra)
    assert r.code == code, r.err
    assert msg in r.err and r.err.startswith("error:") and len(r.err.strip().splitlines()) == 1
    assert r.out == "" and not png.exists()


def test_a_fit_trace_of_other_layers_is_refused(cli, traces, tmp_path):
    other = synthetic_trace(np.full((2, 32), 1 / 32), (1, 2), steps=4, batch=4, top_k=4)
    path = save_trace(tmp_path / "other.npz", other)
    r = simulate(cli, traces[0], "--prefetch", "trace", "--prefetch-fit", path)
    assert r.code == 1 and "differ from the replayed trace's [1, 2, 3, 4]" in r.err


def test_a_plan_that_fills_its_budget_leaves_no_room_for_staging(cli, traces, tiny_hist, tmp_path):
    plan, png = tmp_path / "plan.json", tmp_path / "never.png"
    assert cli("plan", tiny_hist, "--recipe", "tiny", "--hot-gib", "0.005", "-o", plan).code == 0
    r = cli("simulate", "--trace", traces[0], "--recipe", "tiny", "--plan", plan, "--prefetch", "trace",
            "--plot", png)
    assert r.code == 1 and r.out == "" and not png.exists()
    assert r.err.splitlines() == [f"error: {plan}: its hot set fills the budget the staging slots are carved from; "
                                  "plan at the budget less the slots, or simulate prefetch with --fit"]
    assert cli("simulate", "--trace", traces[0], "--recipe", "tiny", "--plan", plan).code == 0
