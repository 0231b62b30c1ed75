"""A synthetic recipe run at a stored precision (the `precision` knob): its banks hold fp8 or
mxfp4 experts, its plan counts their stored bytes, and its outputs equal a reference MoE computing
with the dequantised weights, before and after the dynamic swaps of a run."""

import json

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run
from hotsplit_runtime.moe import ReferenceMoE, make_layer_weights
from hotsplit_runtime.precision import stored_format
from hotsplit_runtime.selftest import tolerances

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.core.errors import UsageError


def _prepared(precision, recipe="tiny", **env):
    r = load_recipe(recipe)
    env = {"HOTSPLIT_PRECISION": precision, "HOTSPLIT_DYN_STEPS": "2", "HOTSPLIT_DYN_MARGIN": "1.0", **env}
    return r, prepare_run(r, resolve_knobs(r.knobs, env), steps=12, scale=0.25)


@pytest.mark.parametrize("precision", ["fp8", "mxfp4"])
def test_a_run_at_a_stored_precision_equals_the_reference_on_dequantised_weights_across_swaps(precision):
    r, p = _prepared(precision, HOTSPLIT_HOT_GIB="0.003")  # about half of the experts hot at either precision
    model = p.engine.model
    assert {b.precision for b in model.banks} == {precision}
    ref = ReferenceMoE([make_layer_weights(model.geom, r.run.seed * 1000 + li, torch.float32, stored_format(precision))
                        for li in range(r.model.num_moe_layers)], torch.device("cpu"))
    x = torch.randn(9, model.geom.hidden, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))
    hot_before = model.hot_LE().copy()
    p.engine.run(p.steps)
    assert (model.hot_LE() != hot_before).any()  # the run swapped experts
    for bank in model.banks:  # each hot copy is its expert's stored bytes
        for slot, e in enumerate(bank.table.slot2expert_S.tolist()):
            assert torch.equal(bank.hot_SB[slot], bank.cold_EB[e])
    torch.testing.assert_close(model.step(x), ref.step(x), **tolerances(torch.float32))


def test_the_plan_and_the_cold_bytes_count_stored_bytes():
    native = _prepared("native")[1]
    for precision, ratio in (("fp8", 0.5), ("mxfp4", 0.27)):
        p = _prepared(precision)[1]
        assert p.expert_bytes == pytest.approx(native.expert_bytes * ratio, rel=0.03)
        assert p.plan.hot_LE.sum() > native.plan.hot_LE.sum()  # the same budget holds more experts
        assert p.engine.expert_bytes == p.expert_bytes  # what the run's cold bytes are counted in


def test_mxfp4_on_dims_not_divisible_by_32_is_refused_in_one_line(tmp_path):
    r = load_recipe("tiny")
    import dataclasses

    odd = dataclasses.replace(r, model=dataclasses.replace(r.model, moe_intermediate_size=136))
    with pytest.raises(UsageError, match=r"^recipe 'tiny': precision mxfp4 needs expert input dims divisible by 32, "
                                         r"got hidden 256 and moe_intermediate 136") as e:
        prepare_run(odd, resolve_knobs(odd.knobs, {"HOTSPLIT_PRECISION": "mxfp4"}), steps=2, scale=0.25)
    assert "\n" not in str(e.value)


def test_scaled_mxfp4_runs_keep_whole_groups_of_32():
    p = _prepared("mxfp4")[1]
    assert p.engine.model.geom.hidden % 32 == 0 and p.engine.model.geom.inter % 32 == 0
    assert np.all([b.stored.s13_EIG.shape[-1] == p.engine.model.geom.hidden // 32 for b in p.engine.model.banks])


def test_run_stores_the_precision_its_flag_asks_for_and_refuses_a_bad_one_in_one_line(cli, tmp_path):
    r = cli("run", "tiny", "--precision", "mxfp4", "--steps", "3", "--scale", "0.25", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["knobs"]["precision"] == "mxfp4" and doc["allocated"]["expert_format"].startswith("mxfp4")
    log = tmp_path / "log.jsonl"
    bad = cli("run", "tiny", "--precision", "int4", "--steps", "3", "--log-jsonl", str(log))
    assert bad.code == 2 and bad.out == ""
    assert bad.err.strip() == "error: --precision: must be one of native, fp8, mxfp4, auto, got 'int4'"
    assert not log.exists()


def test_the_memory_checks_count_the_blobs_the_banks_allocate(monkeypatch):
    """Host and device memory are checked against the stored blobs (mxfp4: about a quarter of
    float32's bytes on this CPU run), not the compute dtype's."""
    import hotsplit_runtime.from_recipe as from_recipe

    asked = []
    monkeypatch.setattr(from_recipe, "check_host_memory", lambda n, *a, **k: asked.append(n))
    for precision in ("native", "mxfp4"):
        p = _prepared(precision)[1]
        banks = p.engine.model.banks
        assert asked[-1] == sum(b.cold_EB.numel() * b.cold_EB.element_size() for b in banks)
