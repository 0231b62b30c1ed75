"""`hotsplit run --precision auto` on a synthetic recipe: each expert stored at the precision its
auto plan chose (one sub-bank per precision of a layer, runtime/mixed_bank.py). Its outputs equal
a reference MoE computing with the dequantised weights, across swaps that keep each expert's
precision; on the shared ESFT law trace its hit rate, cold bytes and copied bytes are `simulate`'s;
what it cannot run is refused in one line, with nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run
from hotsplit_runtime.mixed_bank import MixedBank
from hotsplit_runtime.moe import ReferenceMoE, make_layer_weights
from hotsplit_runtime.selftest import tolerances
from hotsplit_runtime.stored_run import store_layer

from hotsplit_cli.analysis.simulate import SimRequest, run_simulation
from hotsplit_cli.cli import main
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.hotset.planfile import load_plan
from hotsplit_cli.hotset.sizes import precision_bytes
from tests.planning.quality_fixture import quality_block
from tests.runtime.test_trace_replay_breakeven import RECOMMENDED, STAGING_STEPS, law_head_and_intent_hist

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "hist_quality_tiny.json"
torch.set_num_threads(1)  # as a run on the CPU sets it (runtime/device.py tune_cpu_threads)


@pytest.fixture(scope="module")
def tiny_auto(tmp_path_factory) -> Path:
    """An auto plan of the tiny recipe whose layers each mix two or three precisions."""
    folder = tmp_path_factory.mktemp("auto")
    hist = Path(shutil.copy(FIXTURE, folder / "h.json"))
    plan = folder / "plan.json"
    assert main(["plan", str(hist), "--recipe", "tiny", "--hot-gib", "0.005", "--precision", "auto",
                 "--max-error", "0.03", "-o", str(plan)]) == 0
    return plan


def _reference(recipe, plan: Path, geom) -> ReferenceMoE:
    """Every expert quantised at its plan's precision and dequantised, all resident (no banks)."""
    precision_LE = load_plan(plan).precision_LE(recipe.model.moe_layer_ids, recipe.model.num_experts)
    layers = []
    for li in range(recipe.model.num_moe_layers):
        lw = make_layer_weights(geom, recipe.run.seed * 1000 + li, torch.float32)
        store_layer(lw, precision_LE[li], torch.float32)
        layers.append(lw)
    return ReferenceMoE(layers, torch.device("cpu"))


def test_an_auto_run_equals_the_reference_on_dequantised_weights_across_swaps(tiny_auto):
    r = load_recipe("tiny")
    env = {"HOTSPLIT_PRECISION": "auto", "HOTSPLIT_DYN_STEPS": "2", "HOTSPLIT_DYN_MARGIN": "1.0"}
    p = prepare_run(r, resolve_knobs(r.knobs, env), plan_path=tiny_auto, steps=12, scale=0.25)
    model = p.engine.model
    assert all(isinstance(b, MixedBank) and len(b.subs) >= 2 for b in model.banks)
    assert {q for b in model.banks for q in b.precisions} == {"native", "fp8", "mxfp4"}
    plan = load_plan(tiny_auto)
    precision_LE = plan.precision_LE(r.model.moe_layer_ids, 32)
    assert (model.hot_LE() == plan.hot_LE(r.model.moe_layer_ids, 32)).all()
    assert p.plan.hot_bytes == sum(precision_bytes(r)[q] for q in precision_LE[model.hot_LE()])
    ref = _reference(r, tiny_auto, model.geom)
    x = torch.randn(9, model.geom.hidden, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
    hot_before = model.hot_LE().copy()
    s = p.engine.run(p.steps)
    assert s.swaps > 0 and (model.hot_LE() != hot_before).any()  # swaps landed mid-run
    for before, after, names in zip(hot_before, model.hot_LE(), precision_LE, strict=True):
        for q in set(names):  # a swap keeps each expert's precision: hot experts per precision unchanged
            assert before[names == q].sum() == after[names == q].sum()
    assert (model.expert2slot_LE >= 0).numpy().tolist() == model.hot_LE().tolist()  # what the counters read
    for bank in model.banks:  # each hot copy is its expert's stored bytes
        for sub in bank.subs:
            for slot, e in enumerate(sub.table.slot2expert_S.tolist()):
                assert torch.equal(sub.hot_SB[slot], sub.cold_EB[e])
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))


def test_a_swap_across_precisions_is_refused_by_the_bank(tiny_auto):
    r = load_recipe("tiny")
    p = prepare_run(r, resolve_knobs(r.knobs, {"HOTSPLIT_PRECISION": "auto"}), plan_path=tiny_auto, steps=2,
                    scale=0.25)
    bank = p.engine.model.banks[0]
    hot, owner = bank.hot_E, bank.owner_E
    out_e = int(np.flatnonzero(hot)[0])
    in_e = int(np.flatnonzero(~hot & (owner != owner[out_e]))[0])
    with pytest.raises(ValueError, match=f"swap {out_e}->{in_e} crosses precisions"):
        bank.begin_swaps([(out_e, in_e)])
    assert (bank.hot_E == hot).all()


@pytest.fixture(scope="module")
def esft_auto(tmp_path_factory) -> tuple[Path, Path]:
    """The law trace's first 64 steps, and an auto plan fitted on intent at 4 GiB (errors: the
    fixture's, made up; the plan mixes precisions in every layer)."""
    folder = tmp_path_factory.mktemp("esft")
    head, hist = law_head_and_intent_hist(folder, lambda counts: quality_block(counts, seed=2))
    plan = folder / "intent.plan.json"
    assert main(["plan", str(hist), "--recipe", "deepseek-v2-lite", "--hot-gib", "4", "--precision", "auto",
                 "--max-error", "0.05", "-o", str(plan)]) == 0
    return head, plan


@pytest.mark.parametrize("policy, env", [("static", {"HOTSPLIT_DYNAMIC": "0"}),
                                         ("dynamic", {**RECOMMENDED, "HOTSPLIT_DYN_MARGIN": "1.0"}),
                                         ("dynamic", {"HOTSPLIT_DYNAMIC": "1", "HOTSPLIT_DYN_STEPS": "8"})])
def test_an_auto_run_on_the_esft_law_trace_reports_simulates_figures(esft_auto, policy, env):
    """Static, and dynamic under both swap rules: the runtime's hit rate, cold bytes per step and
    bytes copied are `simulate`'s, each expert counted at its stored bytes."""
    head, plan = esft_auto
    recipe = load_recipe("deepseek-v2-lite")
    knobs = resolve_knobs(recipe.knobs, {"HOTSPLIT_PRECISION": "auto", **env})
    sim = run_simulation(SimRequest(head, (policy,), plan_path=plan), recipe, knobs).sums[policy]
    p = prepare_run(recipe, knobs, plan_path=plan, trace_path=head, scale=1 / 64)
    assert all(len(b.subs) >= 2 for b in p.engine.model.banks)
    s = p.engine.run(p.steps)
    assert s.steps == STAGING_STEPS
    assert s.hit_rate == pytest.approx(sim.hit_rate, abs=1e-12)
    assert s.cold_bytes_per_step == pytest.approx(sim.zero_copy_bytes_per_step, rel=1e-12)
    assert s.bytes_copied == pytest.approx(sim.copy_bytes_per_step * s.steps, rel=1e-12)
    assert (s.swaps > 0) == (policy == "dynamic")


def _run_refused(cli, log: Path, *args: str, synthetic: bool = True) -> str:
    r = cli("run", *args, *(("--steps", "2", "--scale", "0.25") if synthetic else ()), "--log-jsonl", log)
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert not log.exists()
    return r.err


def test_what_an_auto_run_cannot_do_is_refused_in_one_line_and_writes_nothing(cli, tiny_auto, tmp_path):
    import yaml

    log = tmp_path / "run.jsonl"
    assert "run stores each expert at the precision an auto plan chose for it, and no --plan was given" in \
        _run_refused(cli, log, "tiny", "--precision", "auto")
    fp8 = tmp_path / "fp8.json"
    assert main(["plan", str(FIXTURE), "--recipe", "tiny", "--hot-gib", "0.005", "--precision", "fp8",
                 "-o", str(fp8)]) == 0
    assert "was planned at precision fp8, but experts are stored at auto" in \
        _run_refused(cli, log, "tiny", "--precision", "auto", "--plan", fp8)
    assert "was planned at precision auto, but experts are stored at fp8" in \
        _run_refused(cli, log, "tiny", "--precision", "fp8", "--plan", tiny_auto)
    assert "cold_path cpu: the CPU cold path computes experts of one stored precision" in \
        _run_refused(cli, log, "tiny", "--precision", "auto", "--plan", tiny_auto, "--cold-path", "cpu")
    rec = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    rec["parallel"] = {"tp": 1, "ep": 2}
    (tmp_path / "ep2.yaml").write_text(yaml.safe_dump(rec))
    assert "auto runs on one rank, and recipe 'tiny' has ep 2" in \
        _run_refused(cli, log, str(tmp_path / "ep2.yaml"), "--precision", "auto", "--plan", tiny_auto)
    trace = tmp_path / "t.trace.npz"
    np.savez(trace, topk_ids=np.zeros((4, 4, 2, 4), dtype=np.int64), layers=np.arange(1, 5))
    assert "prefetch trace: staging slots are sized for one stored precision" in \
        _run_refused(cli, log, "tiny", "--precision", "auto", "--plan", tiny_auto, "--prefetch", "trace",
                     "--trace", trace)


def test_the_host_memory_check_counts_each_expert_at_its_plans_bytes(tiny_auto, monkeypatch):
    import hotsplit_cli.hotset.host_memory as host_memory

    asked = []
    monkeypatch.setattr(host_memory, "host_fit", lambda *a: asked.append(a[4]))
    r = load_recipe("tiny")
    host_memory.check_host_fits(r, None, 0.25, "auto", load_plan(tiny_auto))
    table = precision_bytes(r)
    names = load_plan(tiny_auto).precision_LE(r.model.moe_layer_ids, 32)
    assert asked == [int(sum(table[q] for q in names.ravel()) * 0.25 * 0.25)]
    host_memory.check_host_fits(r, None, 0.25, "native")
    assert asked[-1] is None  # one precision: the banks are sized from it


def test_prepare_run_at_auto_without_a_plan_is_refused():
    r = load_recipe("tiny")
    with pytest.raises(UsageError, match="no --plan was given"):
        prepare_run(r, resolve_knobs(r.knobs, {"HOTSPLIT_PRECISION": "auto"}), steps=2, scale=0.25)
