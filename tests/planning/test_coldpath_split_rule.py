"""The split rule of hotsplit_cli/hotset/coldpath.py, exactly: the CPU takes a prefix of the cold
experts ordered by how much more the CPU pays for each than the GPU (cpu time / gpu time, ties by
expert id), the prefix that minimises the layer's cold time, and among equal times the shortest.

The cases use rates that are powers of two and whole gigabytes, so every time below is a dyadic
number computed exactly in floating point and a tie is a true tie."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotsplit_cli.hotset.coldpath import ColdRates, split_cold

GB = 1e9
TOKENS = (1.0, 2.0, 4.0, 8.0)  # the measured points: a token count drawn from these is never interpolated


def reference_split(bytes_N, tokens_N, rates: ColdRates) -> list[bool]:
    """The rule as the module docstring states it, written out with plain Python loops."""
    n = len(bytes_N)
    gpu = [b / (rates.zero_copy_gbps * GB) for b in bytes_N]
    cpu = [b / (rates.cpu_gbps(t) * GB) for b, t in zip(bytes_N, tokens_N, strict=True)]
    order = sorted(range(n), key=lambda i: (cpu[i] / gpu[i], i))
    sync_s = rates.sync_ms / 1e3
    costs = []
    for k in range(n + 1):
        cpu_part = sum(cpu[i] for i in order[:k]) + (sync_s if k else 0.0)
        gpu_part = sum(gpu[i] for i in order[k:])
        costs.append(max(cpu_part, gpu_part))
    k = costs.index(min(costs))  # the first minimum: the fewest experts to the CPU
    return [i in order[:k] for i in range(n)]


def _rates(cpu_gbps_at: tuple[float, ...], zero_copy_gbps: float = 1.0, sync_ms: float = 0.0) -> ColdRates:
    return ColdRates(zero_copy_gbps, tuple(zip(TOKENS, cpu_gbps_at, strict=True)), sync_ms)


def test_the_cpu_takes_the_experts_it_is_relatively_cheapest_for_not_the_quickest():
    """A large expert read by one token costs the CPU as much as the GPU (ratio 1); a small one
    read by 8 tokens costs the CPU 10x the GPU but less CPU time than the large one. The CPU must
    take the large one: ordering by CPU time alone would hand it the small one."""
    rates = ColdRates(10.0, ((1.0, 10.0), (8.0, 1.0)))
    bytes_N, tokens_N = [4 * GB, 0.1 * GB], [1, 8]
    # ratio: 1 and 10; CPU time: 0.4 s and 0.1 s
    split = split_cold(bytes_N, tokens_N, rates)
    assert split.to_cpu_N.tolist() == [True, False]
    assert (split.cpu_s, split.gpu_s) == pytest.approx((0.4, 0.01))


def test_the_cpu_share_is_a_prefix_of_the_ratio_order_not_of_expert_ids():
    # CPU GB/s at 1, 2, 4, 8 tokens: the ratio (zero-copy 1 GB/s / CPU rate) is 1/4, 1/2, 1, 2
    rates = _rates((4.0, 2.0, 1.0, 0.5))
    tokens_N = [8, 4, 2, 1, 8, 1]  # ratios 2, 1, 1/2, 1/4, 2, 1/4
    bytes_N = [GB] * 6
    split = split_cold(bytes_N, tokens_N, rates)
    # ratio order: 3, 5 (1/4, ties by id), 2 (1/2), 1 (1), 0, 4 (2). k=3: CPU 0.25+0.25+0.5 = 1 s,
    # GPU 3 s; k=4: CPU 2 s, GPU 2 s; k=5: CPU 4 s. The best is k=4: experts 1, 2, 3, 5.
    assert split.to_cpu_N.tolist() == [False, True, True, True, False, True]
    assert split.to_cpu_N.tolist() == reference_split(bytes_N, tokens_N, rates)
    assert (split.cpu_s, split.gpu_s) == (2.0, 2.0)


@pytest.mark.parametrize("n, k", [(1, 0), (2, 1), (3, 1), (5, 2), (6, 3)])
def test_ties_give_the_cpu_the_fewest_experts(n, k):
    """Equal experts, equal rates: with an odd count two prefixes give the same time (3 experts:
    one or two to the CPU both take 2 s); the CPU gets the shorter. One expert: the CPU alone
    takes as long as the GPU alone, so the GPU keeps it."""
    split = split_cold([GB] * n, [1] * n, _rates((1.0,) * 4))
    assert split.to_cpu_N.tolist() == [True] * k + [False] * (n - k)
    assert split.seconds == max(k, n - k)


def test_a_tie_in_ratio_goes_to_the_lower_expert_id():
    split = split_cold([2 * GB, GB, GB, 2 * GB], [1, 1, 1, 1], _rates((1.0,) * 4))
    # all ratios 1: the order is by id, 0 1 2 3: the CPU takes 0 and 1 (3 s), the GPU 2 and 3 (3 s)
    assert split.to_cpu_N.tolist() == [True, True, False, False]


def test_the_sync_cost_counts_once_and_can_keep_the_cpu_out():
    slow_sync = _rates((1.0,) * 4, sync_ms=1500.0)
    two = split_cold([GB, GB], [1, 1], slow_sync)  # one to the CPU: 1 + 1.5 s, more than the GPU's 2 s
    assert two.to_cpu_N.tolist() == [False, False] and (two.gpu_s, two.cpu_s) == (2.0, 0.0)
    four = split_cold([GB] * 4, [1] * 4, _rates((1.0,) * 4, sync_ms=500.0))
    # k experts to the CPU: k + 0.5 s (sync once) vs 4 - k s: 4, 3, 2.5, 3.5, 4.5 for k = 0..4
    assert four.to_cpu_N.tolist() == [True, True, False, False]
    assert (four.cpu_s, four.gpu_s) == (2.5, 2.0)


cases = st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([1, 2, 3, 4]), min_size=n, max_size=n),  # GB
    st.lists(st.sampled_from(TOKENS), min_size=n, max_size=n),
    st.tuples(*[st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0])] * 4),  # CPU GB/s at each point
    st.sampled_from([0.5, 1.0, 2.0]),  # zero-copy GB/s
    st.sampled_from([0.0, 250.0, 1000.0]),  # sync ms
))


@settings(max_examples=300, deadline=None)
@given(cases)
def test_split_equals_the_rule_written_out(case):
    gbytes, tokens, cpu_at, zero_copy, sync_ms = case
    rates = _rates(cpu_at, zero_copy, sync_ms)
    bytes_N = [g * GB for g in gbytes]
    split = split_cold(bytes_N, tokens, rates)
    assert split.to_cpu_N.tolist() == reference_split(bytes_N, tokens, rates)
    on_cpu = split.to_cpu_N.tolist()
    cpu_s = sum(b / (rates.cpu_gbps(t) * GB) for b, t, c in zip(bytes_N, tokens, on_cpu, strict=True) if c)
    assert split.cpu_s == cpu_s + (sync_ms / 1e3 if any(on_cpu) else 0.0)
    assert split.gpu_s == sum(b / (zero_copy * GB) for b, c in zip(bytes_N, on_cpu, strict=True) if not c)


def test_the_whole_split_is_never_slower_than_either_path_alone_and_beats_both_somewhere():
    """The prefix rule includes 'none' and 'all', so it is never slower than gpu or cpu alone;
    the check here is the case where it is strictly faster than both."""
    bytes_N, tokens_N = [GB] * 4, [1] * 4
    rates = _rates((1.0,) * 4)
    split = split_cold(bytes_N, tokens_N, rates)
    alone = {m: split_cold(bytes_N, tokens_N, rates, m).seconds for m in ("gpu", "cpu")}
    assert split.seconds == 2.0 and alone == {"gpu": 4.0, "cpu": 4.0}
    assert np.flatnonzero(split.to_cpu_N).tolist() == [0, 1]


def test_the_worked_example_of_docs_runtime_md():
    """docs/runtime.md's worked example, from its stated inputs: 8 cold DeepSeek-V3 expert slices
    of 7168 x 256 bf16 (gate, up, down: 11.0 MB), zero-copy 50 GB/s, CPU 14 GB/s at 1 token,
    hand-off 0.02 ms. The split gives the CPU 1 of 8 and the layer 1.54 ms against the GPU's
    1.76 ms alone; below about 6.3 GB/s the CPU gets nothing."""
    expert = 7168 * 256 * 3 * 2
    assert round(expert / 1e6, 1) == 11.0 and round(expert / 2 ** 20, 1) == 10.5
    rates = ColdRates(50.0, ((1.0, 14.0),), sync_ms=0.02)
    gpu_only = split_cold([expert] * 8, [1] * 8, rates, mode="gpu")
    split = split_cold([expert] * 8, [1] * 8, rates)
    assert round(gpu_only.seconds * 1e3, 2) == 1.76
    assert int(split.to_cpu_N.sum()) == 1
    assert (round(split.gpu_s * 1e3, 2), round(split.cpu_s * 1e3, 2), round(split.seconds * 1e3, 2)) == (
        1.54, 0.81, 1.54)
    assert round(100 * (1 - split.seconds / gpu_only.seconds), 1) == 12.5  # one expert of 8 off the link
    # a second CPU expert would finish later than the GPU's other 7
    assert round((2 * expert / 14e9 + 0.02e-3) * 1e3, 2) == 1.59
    # the threshold: one expert on the CPU (and the hand-off) must beat all 8 on the GPU
    threshold = expert / 1e9 / (8 * expert / 50e9 - 0.02e-3)
    assert round(threshold, 1) == 6.3
    assert split_cold([expert] * 8, [1] * 8, ColdRates(50.0, ((1.0, 6.2),), 0.02)).to_cpu_N.sum() == 0
    assert split_cold([expert] * 8, [1] * 8, ColdRates(50.0, ((1.0, 6.4),), 0.02)).to_cpu_N.sum() == 1
