"""The GPU compute rate (probes/gpu_compute.py) on a recording fake of torch's CUDA calls: what is
timed, and the GB/s it makes of the event times."""

from __future__ import annotations

import pytest
from hotsplit_probes.gpu_compute import TOKENS, measure_gpu_compute


class FakeTensor:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def numel(self):
        return self.shape[0] * self.shape[1]

    def element_size(self):
        return 2


class FakeTorch:
    """torch as the measurement uses it: every matmul is logged, and the device time between two
    events is 0.1 ms per product up to 16 tokens, then growing with the tokens (compute-bound)."""

    bfloat16 = "bfloat16"

    def __init__(self):
        self.products: list[tuple] = []
        self.devices: list[str] = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = len(fake.products)

            def synchronize(self):
                pass

            def elapsed_time(self, end):  # ms, as CUDA events report
                return sum(0.1 * max(1.0, x.shape[0] / 16) for x, _ in fake.products[self.at:end.at])

        class Cuda:
            Event = staticmethod(lambda enable_timing=False: Event(enable_timing))

            @staticmethod
            def device(device):
                fake.devices.append(device)
                import contextlib

                return contextlib.nullcontext()

        self.cuda = Cuda()

    def device(self, kind, index):
        return f"{kind}:{index}"

    def randn(self, *shape, dtype, device):
        return FakeTensor(shape, dtype)

    def matmul(self, x, w):
        assert x.shape[1] == w.shape[0] and x.dtype == w.dtype == "bfloat16"
        self.products.append((x, w))


def test_each_token_count_is_timed_on_the_gpu_and_made_gbps_of_the_weights():
    torch, ticks = FakeTorch(), []
    got = measure_gpu_compute(3, ticks.append, samples=5, iterations=4, load=lambda: torch, shape=(64, 128))
    assert torch.devices == ["cuda:3"] and ticks == [1] * len(TOKENS)
    # per token count: one warm-up sample and 5 timed ones, of 4 products each
    assert len(torch.products) == len(TOKENS) * 6 * 4
    assert [t for t, _ in got.by_tokens] == list(TOKENS) and got.weight_bytes == 64 * 128 * 2
    for tokens, m in got.by_tokens:
        ms = 0.1 * max(1.0, tokens / 16)
        assert m.median_gbps == pytest.approx(64 * 128 * 2 / (ms / 1e3) / 1e9)
        assert m.samples == 5 and m.spread_gbps == pytest.approx(0.0)
    assert got.dtype == "bfloat16" and "x [T, 4096] @ W [4096, 16384]" in got.method


def test_the_platform_records_the_rate_of_each_gpu_and_a_reason_where_it_failed(gpu_sources):
    import dataclasses

    from hotsplit_probes.platform import measure_platform, take_inventory

    doc = measure_platform(take_inventory("quick", None, gpu_sources), gpu_sources).to_doc()
    assert [c[0] for c in doc["gpus"][0]["compute"]["by_tokens"]] == list(TOKENS)

    def broken(cuda_index, tick=None):
        raise RuntimeError("CUDA error: out of memory")

    src = dataclasses.replace(gpu_sources, gpu_compute=broken)
    ticks = []
    inv = take_inventory("quick", None, src)
    doc = measure_platform(inv, src, tick=ticks.append).to_doc()
    assert doc["gpus"][0]["compute"] is None and sum(ticks) == inv.measurement_steps
    assert {"field": "gpus[0].compute", "reason": "measurement failed: RuntimeError: CUDA error: out of memory"} \
        in doc["reasons"]
