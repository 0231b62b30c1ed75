"""Will it fit (runtime/memory.py): one host-memory share and one error type for every way of
building a run, each caller's message kept (a recipe's synthetic banks, a checkpoint's banks)."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch
from hotsplit_runtime import memory
from hotsplit_runtime.device import choose_device

from hotsplit_cli.core.errors import RuntimeFailure

CPU = choose_device("cpu")
FAKE_GPU = dataclasses.replace(CPU, is_cuda=True, name="Fake GPU")


@pytest.fixture
def available(monkeypatch):
    """Set what psutil reports as available host memory, in bytes."""
    def set_available(n_bytes: int) -> None:
        monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": n_bytes})())
    return set_available


def test_host_memory_share_is_the_limit(available):
    available(10_000)
    memory.check_host_memory(8_000, "the bank needs", "hint")  # 0.8 x 10,000: allowed
    with pytest.raises(RuntimeFailure) as exc:
        memory.check_host_memory(8_001, "the bank needs", "buy RAM")
    assert exc.value.message == "the bank needs 7.81 KiB of host memory, 9.77 KiB is available"
    assert exc.value.hint == "buy RAM"


def test_device_memory_is_checked_only_on_a_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 30, 80 << 30))
    memory.check_device_memory(1 << 40, CPU, "the hot bank needs", "hint")  # a CPU run: nothing to check
    memory.check_device_memory(1 << 30, FAKE_GPU, "the hot bank needs", "hint")
    with pytest.raises(RuntimeFailure) as exc:
        memory.check_device_memory(3 << 29, FAKE_GPU, "the hot bank needs", "lower --hot-gib")
    assert exc.value.message == "the hot bank needs 1.50 GiB on Fake GPU, 1.00 GiB is free"


def test_recipe_run_refuses_a_cold_bank_larger_than_host_memory(available):
    from hotsplit_runtime.from_recipe import prepare_run

    from hotsplit_cli.config.knobs import resolve_knobs
    from hotsplit_cli.config.recipe import load_recipe

    rec = load_recipe("tiny")
    available(1 << 20)
    with pytest.raises(RuntimeFailure) as exc:
        prepare_run(rec, resolve_knobs(rec.knobs, env={}), steps=2, scale=0.25)
    # tiny at scale 0.25: 4 MoE layers x 32 experts x 3 x 64 x 32 fp32 = 3 MiB > 0.8 x 1 MiB
    assert exc.value.message == "the cold bank needs 3.00 MiB of host memory, 1.00 MiB is available"
    assert "--scale" in exc.value.hint


def test_recipe_run_refuses_a_hot_bank_larger_than_the_free_device_memory(monkeypatch):
    from hotsplit_runtime.from_recipe import _check_bytes

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 20, 80 << 30))
    bf16_blob = 3 * 64 * 128 * 2
    host = 2 * 8 * bf16_blob  # 2 MoE layers x 8 experts
    _check_bytes(host, 16 * bf16_blob, FAKE_GPU)  # 16 x 3 x 64 x 128 x 2 B = 768 KiB
    with pytest.raises(RuntimeFailure, match=r"the hot bank needs 1.12 MiB on Fake GPU, 1.00 MiB is free"):
        _check_bytes(host, 24 * bf16_blob, FAKE_GPU)
