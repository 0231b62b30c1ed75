"""Router lookahead in the runtime on a synthetic model (runtime/lookahead_stage.py): while layer
l's output exists, layer l + 1's router guesses and its cold guesses are staged. Outputs equal a
run without prefetch, a staged expert is never hot, the recorded recall equals one computed by
hand from the hidden states each layer read, and the staging counters equal the staged experts
recorded against the routing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.config.recipe import load_recipe
from tests.runtime.test_prefetch_runtime import (
    assert_same_outputs_nothing_left_staged,
    knobs,
    trace_path,  # noqa: F401 - a fixture
)

torch.set_num_threads(1)


def tiny(traffic: str = "synthetic"):
    r = load_recipe("tiny")
    return dataclasses.replace(r, run=dataclasses.replace(r.run, scale=0.25),
                               traffic=dataclasses.replace(r.traffic, kind=traffic, batch=8))


def _steps(p, n: int) -> list[torch.Tensor]:
    outs = []
    for routed in p.engine.source.steps():
        if p.engine.step_count == n:
            break
        p.engine.step(routed)
        outs.append(p.engine.out_TH.clone())
    return outs


@pytest.mark.parametrize("traffic", ["prompts", "trace"])
def test_outputs_with_lookahead_equal_outputs_without(trace_path, traffic):  # noqa: F811
    """The model's own router routing (prompts) and a replayed trace: every step's output equal."""
    r = tiny(traffic)
    base = dict(dynamic=0, hot_gib=0.0035)
    trace = trace_path if traffic == "trace" else None
    p_off = prepare_run(r, knobs(r, prefetch="off", **base), trace_path=trace, steps=12)
    p_on = prepare_run(r, knobs(r, prefetch="lookahead", prefetch_slots=3, prefetch_guesses=6, **base),
                       trace_path=trace, steps=12)
    off, on = _steps(p_off, 12), _steps(p_on, 12)
    assert len(on) == len(off) == 12
    assert_same_outputs_nothing_left_staged(off, on, p_off, p_on, 3)


def _rank_by_hand(router, x_TH: torch.Tensor, geom) -> torch.Tensor:
    """Every expert ranked: the group-limited top-k of sigmoid + bias, then the rest by that score."""
    score = (x_TH.float() @ router.weight_EH.T).sigmoid() + router.bias_E
    groups = score.view(len(score), geom.n_group, -1)
    best = groups.topk(2, dim=-1).values.sum(-1).topk(geom.topk_group, dim=-1).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, best[..., None].expand(-1, -1, groups.shape[-1]),
                                                               True).view_as(score)
    top = score.masked_fill(~keep, float("-inf")).topk(geom.top_k, dim=-1).indices
    rest = score.scatter(1, top, float("-inf")).argsort(dim=-1, descending=True, stable=True)[:, :-geom.top_k]
    return torch.cat([top, rest], dim=1)


@pytest.mark.parametrize("guesses", [4, 7])
def test_recorded_recall_and_staging_equal_a_computation_by_hand(trace_path, guesses):  # noqa: F811
    """Each layer's input (layer l - 1's output through the norm) is captured; the guesses ranked
    by hand from it are counted against the trace's routing, and every staged expert against the
    step's routed assignments."""
    r = tiny("trace")
    p = prepare_run(r, knobs(r, prefetch="lookahead", prefetch_slots=5, prefetch_pool="layer",
                             prefetch_guesses=guesses, dynamic=0, hot_gib=0.0035), trace_path=trace_path)
    model, inputs, staged = p.engine.model, [], []
    real_layer = model.layer

    def capture(li, x_TH, ids_TK=None, w_TK=None, routed=None):
        inputs.append((li, x_TH.clone(), ids_TK.clone()))
        return real_layer(li, x_TH, ids_TK, w_TK, routed)
    for li, bank in enumerate(model.banks):
        real_stage = bank.stage

        def record(experts, li=li, bank=bank, real_stage=real_stage):
            assert not bank.served_hot_E[experts].any()  # a staged expert is never hot
            staged.append((li, list(experts)))
            real_stage(experts)
        bank.stage = record
    model.layer = capture
    s = p.engine.run(p.steps)
    tokens = useful = prefetched = read = staged_hits = 0
    for (li, x_TH, ids_TK), (lj, experts) in zip([c for c in inputs if c[0] > 0], staged, strict=True):
        assert lj == li and len(experts) <= 5
        live = ids_TK[:, 0] >= 0
        guess = _rank_by_hand(model.routers[li], x_TH, model.geom)[:, :guesses]
        tokens += int(live.sum())
        useful += int(((ids_TK[:, :, None] == guess[:, None, :]).any(-1) & live[:, None]).sum())
        counts = np.bincount(ids_TK[ids_TK >= 0].numpy(), minlength=32)
        prefetched, read, staged_hits = prefetched + len(experts), read + int((counts[experts] > 0).sum()), \
            staged_hits + int(counts[experts].sum())
    look = s.prefetch["lookahead"]
    assert (look["useful"], look["routed"], look["guesses"]) == (useful, tokens * 4, tokens * guesses)
    assert look["recall"] == pytest.approx(useful / (tokens * 4))
    assert (s.prefetch["prefetched"], s.prefetch["useful"], s.prefetch["staged_hits"]) == (prefetched, read,
                                                                                           staged_hits)
    assert prefetched > read > 0 and s.prefetch["predictor"] == "lookahead"


def test_on_the_models_own_routing_the_next_router_is_exact():
    """A synthetic model has no attention between layers: layer l + 1's router on layer l's output
    is what layer l + 1 routes by, so its top-k guesses cover every routed expert."""
    r = tiny("prompts")
    p = prepare_run(r, knobs(r, prefetch="lookahead", prefetch_guesses=4, dynamic=0, hot_gib=0.0035), steps=4)
    s = p.engine.run(p.steps)
    look = s.prefetch["lookahead"]
    assert look["recall"] == 1.0 and look["routed"] == 4 * 8 * 3 * 4  # steps x tokens x layers 1..3 x top_k
    # Staging widens past the hot experts (a token's first G cold guesses), so a staged guess may go unread.
    assert s.prefetch["prefetched"] >= s.prefetch["useful"] > 0
