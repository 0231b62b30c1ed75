import numpy as np
import pytest

from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.traffic.synthetic import SyntheticTraffic, inclusion_probs, synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import Trace, load_trace, save_trace


def test_synthetic_traffic_reproduces_shares_within_sampling_error():
    shares = zipf_shares(3, 16, 0.8, seed=2)
    trace = synthetic_trace(shares, (1, 2, 3), steps=300, batch=32, top_k=4, seed=5)
    counts = trace.counts_LE(16)
    n = counts.sum(axis=1, keepdims=True)
    got = counts / n
    expect = inclusion_probs(shares, 4) / 4
    tokens = 300 * 32
    sigma = np.sqrt(expect * (1 - expect) / tokens)  # per-token Bernoulli, /K folded in expect
    assert np.all(np.abs(got - expect) < 5 * sigma + 1e-9)


def test_every_token_gets_k_distinct_experts():
    src = SyntheticTraffic(zipf_shares(2, 8, 2.0), top_k=3, batch=50)
    ids = src.next_step()
    assert ids.shape == (2, 50, 3)
    assert all(len(set(row)) == 3 for row in ids.reshape(-1, 3).tolist())


def test_inclusion_probabilities_are_capped_and_sum_to_k():
    pi = inclusion_probs(np.array([[0.9, 0.05, 0.03, 0.02]]), 2)
    assert pi.max() == pytest.approx(1.0)
    assert pi.sum() == pytest.approx(2.0)


def test_drift_moves_the_hotspot():
    shares = np.zeros((1, 6))
    shares[0, 0] = 1.0
    shares[0, 1:] = 0.01
    src = SyntheticTraffic(shares, top_k=1, batch=200, drift_every=10, drift_shift=3)
    first = np.bincount(np.concatenate([src.next_step().ravel() for _ in range(10)]), minlength=6)
    second = np.bincount(np.concatenate([src.next_step().ravel() for _ in range(10)]), minlength=6)
    assert first.argmax() == 0 and second.argmax() == 3


def test_trace_round_trip_and_validation(tmp_path):
    ids = np.random.default_rng(0).integers(0, 8, size=(4, 2, 3, 2)).astype(np.int16)
    ids[0, 0, 0, 0] = -1  # padding is not counted
    save_trace(tmp_path / "t.npz", Trace(ids, (3, 5)))
    back = load_trace(tmp_path / "t.npz", num_experts=8)
    assert back.layers == (3, 5)
    assert back.counts_LE(8).sum() == ids.size - 1
    with pytest.raises(InputFileError, match="model has 4 experts"):
        load_trace(tmp_path / "t.npz", num_experts=4)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputFileError, match="not a readable"):
        load_trace(tmp_path / "bad.npz")
