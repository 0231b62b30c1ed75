"""Live rebalancing never makes stationary traffic worse and still follows drift
(placement/live.py: the rule every rank applies at each `eplb_steps` rebalance)."""

from pathlib import Path

import numpy as np
import pytest

from hotsplit_cli.placement.algorithm import Geometry, place_experts
from hotsplit_cli.placement.evaluate import evaluate
from hotsplit_cli.placement.live import judge_rebalance, replay_rebalancing

_ROOT = Path(__file__).resolve().parents[2]
ROUTING = next((p / "shared" / "data" / "routing" for p in (_ROOT.parent, _ROOT.parent.parent)
                if (p / "shared" / "data" / "routing").is_dir()), _ROOT.parent / "shared" / "data" / "routing")
LAYERS, EXPERTS, RANKS = 4, 32, 4


def _stationary(steps: int, tokens: int, seed: int) -> np.ndarray:
    """Per-step counts [S, L, E] drawn from one fixed skewed distribution per layer."""
    rng = np.random.default_rng(seed)
    p_LE = rng.permuted(np.tile(1.0 / np.arange(1, EXPERTS + 1), (LAYERS, 1)), axis=1)
    p_LE /= p_LE.sum(axis=1, keepdims=True)
    return np.stack([[rng.multinomial(tokens, p) for p in p_LE] for _ in range(steps)]).astype(np.float64)


@pytest.mark.parametrize("eplb_steps", [1, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stationary_traffic_never_ends_lower_than_no_rebalancing(eplb_steps, seed):
    fit = _stationary(64, 96, seed + 100).sum(axis=0)  # the plan's histogram: the same distribution
    start = place_experts(fit[None], tuple(range(LAYERS)), Geometry(RANKS, 4))
    run = replay_rebalancing(_stationary(64, 96, seed), start, eplb_steps)
    assert run.balancedness >= run.static_balancedness - 1e-12, run


def test_a_candidate_is_judged_on_steps_it_did_not_see():
    """A refit on one step wins on that step; scored on the next step, it must not be applied
    unless it wins there too."""
    steps = _stationary(2, 8, 4)  # tiny, noisy steps
    start = place_experts(_stationary(64, 96, 104).sum(axis=0)[None], tuple(range(LAYERS)), Geometry(RANKS, 4))
    v = judge_rebalance(steps, 1, start, EXPERTS)
    assert v.fitted_steps == 1 and v.heldout_steps == 1
    assert v.kept_heldout == pytest.approx(evaluate(steps[1:], start).balancedness)
    assert v.candidate_heldout == pytest.approx(evaluate(steps[1:], v.candidate).balancedness)
    assert v.apply == (v.candidate_heldout >= v.kept_heldout + 0.01)


def test_drift_to_other_traffic_is_followed():
    """Fitted on one distribution, replayed on another: the rebalances must be applied and help."""
    fit = _stationary(64, 96, 200).sum(axis=0)
    start = place_experts(fit[None], tuple(range(LAYERS)), Geometry(RANKS, 4))
    run = replay_rebalancing(_stationary(64, 96, 7), start, 8)
    assert run.applied_at and run.balancedness > run.static_balancedness + 0.02, run


@pytest.mark.skipif(not ROUTING.is_dir(), reason="the shared routing records are absent")
@pytest.mark.parametrize("fit_task, replay_task", [("intent", "law"), ("law", "intent")])
def test_esft_drift_at_ep4_eplb_32_keeps_raising_balancedness(fit_task, replay_task):
    from hotsplit_cli.traffic.trace import load_trace

    def counts(task):
        return load_trace(ROUTING / f"esft-v2lite-{task}.trace.npz", 64).counts_SLE(64).astype(np.float64)

    fit, replay = counts(fit_task), counts(replay_task)
    start = place_experts(fit.sum(axis=0)[None], tuple(range(fit.shape[1])), Geometry(4, 0))
    run = replay_rebalancing(replay, start, 32)
    assert run.applied_at and run.balancedness > run.static_balancedness + 0.02, run
