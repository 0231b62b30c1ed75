"""A checkpoint's routed experts stored at an auto plan's precisions, one bank per precision in a
mixed layer (runtime/mixed_bank.py): each expert quantised once as the cold bank fills, hot copies
the same bytes, swaps within a precision, and the runtime computes what transformers computes on
the same checkpoint with each routed expert replaced by its own stored value read back."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from hotsplit_runtime.hf.loader import load_model, load_tokenizer  # noqa: E402
from hotsplit_runtime.mixed_bank import MixedBank  # noqa: E402

from hotsplit_cli.core.errors import UsageError  # noqa: E402
from tests.conftest import cpu_without_triton  # noqa: E402
from tests.fakes.hf import SENTENCES, mxfp4_release, reference  # noqa: E402
from tests.runtime.test_hf_stored_precision import (  # noqa: E402
    _batch,
    _logits,
    groupable_checkpoints,
    stored_reference,
)

FAMILIES = ("qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss")


def mixed_precisions(num_layers: int, num_experts: int, seed: int, names=("native", "fp8", "mxfp4")) -> np.ndarray:
    """str [L, E]: every layer mixes every precision of `names` (each expert's drawn at random)."""
    rng = np.random.default_rng(seed)
    out = np.asarray(names, dtype=object)[rng.integers(0, len(names), (num_layers, num_experts))]
    for row in out:
        row[:len(names)] = names  # each precision present in each layer
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return groupable_checkpoints(tmp_path_factory.mktemp("auto"), FAMILIES)


def _auto_model(folder, seed: int, names=("native", "fp8", "mxfp4"), info=None):
    """The checkpoint at an auto layout drawn with `seed`, and that layout."""
    probe = load_model(folder, info or cpu_without_triton(), torch.float32)
    P = mixed_precisions(len(probe.layer_ids), probe.num_experts, seed, names)
    return load_model(folder, info or cpu_without_triton(), torch.float32, precision="auto", precision_LE=P), P


def _swap_within_precisions(bank: MixedBank) -> None:
    """In every sub-bank, one hot expert leaves for a cold one of the same precision, mid-run."""
    moves = []
    for ids, sub in zip(bank.ids, bank.subs, strict=True):
        hot, cold = np.flatnonzero(sub.hot_E), np.flatnonzero(~sub.hot_E)
        if len(hot) and len(cold):
            moves.append((int(ids[hot[0]]), int(ids[cold[0]])))
    assert moves
    bank.begin_swaps(moves)
    bank.publish_ready(wait=True)
    for out_e, in_e in moves:
        assert bank.served_hot_E[in_e] and not bank.served_hot_E[out_e]
    for sub in bank.subs:  # hot copies are the stored bytes
        for slot, e in enumerate(sub.table.slot2expert_S.tolist()):
            assert torch.equal(sub.hot_SB[slot], sub.cold_EB[e])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_at_an_auto_plans_precisions_equals_transformers_on_each_experts_read_back_weights(
        plain, family, tmp_path):
    hm, P = _auto_model(plain[family], seed=FAMILIES.index(family))
    want_model = reference(stored_reference(plain[family], tmp_path / "ref", P, hm.layer_ids))
    batch = _batch(plain[family])
    with torch.no_grad():
        want = want_model(**batch).logits
    E = hm.num_experts
    for bank, row in zip(hm.banks, P, strict=True):  # one bank per precision, each its experts
        assert isinstance(bank, MixedBank) and sorted(bank.precisions) == ["fp8", "mxfp4", "native"]
        for ids, sub in zip(bank.ids, bank.subs, strict=True):
            assert set(row[ids]) == {sub.precision} and sub.num_experts == len(ids)
            assert (sub.cold_EB.dtype == torch.uint8) == (sub.precision != "native")
    for hot in (np.zeros(E, bool), np.arange(E) % 2 == 0):
        for b in hm.banks:
            b.set_hot(hot)
        torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    for b in hm.banks:
        _swap_within_precisions(b)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="crosses precisions"):
        b = hm.banks[0]
        b.begin_swaps([(int(b.ids[0][0]), int(b.ids[1][0]))])


def test_gpt_oss_as_released_in_mxfp4_at_native_and_mxfp4_equals_transformers_dequantising_it(plain, tmp_path):
    """Both precisions keep the release's bytes (two banks, swaps within each); fp8 is refused."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    release = mxfp4_release(plain["gpt_oss"], tmp_path / "gpt_oss")
    batch = _batch(release)
    ref = AutoModelForCausalLM.from_pretrained(release, dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        want = ref(**batch).logits
    hm, P = _auto_model(release, seed=3, names=("native", "mxfp4"))
    for b in hm.banks:
        assert [s.precision for s in b.subs] == ["mxfp4", "mxfp4"] and b.subs[0].cold_EB.dtype == torch.uint8
        b.set_hot(np.arange(hm.num_experts) % 3 == 0)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    for b in hm.banks:
        _swap_within_precisions(b)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    P[0, 1] = "fp8"
    _refused_before_allocating(release, P, "the checkpoint's experts are released in mxfp4, and fp8 would store")


def _refused_before_allocating(folder, precision_LE, says: str) -> None:
    from hotsplit_runtime import pinned

    allocs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pinned.PinnedAllocator, "alloc", lambda self, n: allocs.append(n))
        with pytest.raises(UsageError) as e:
            load_model(folder, cpu_without_triton(), torch.float32, precision="auto", precision_LE=precision_LE)
    assert allocs == [] and "\n" not in str(e.value) and says in str(e.value)


def test_an_auto_layout_of_another_shape_is_refused_in_one_line_before_allocating(plain):
    folder = plain["qwen3_moe"]  # 2 MoE layers of 8 experts
    _refused_before_allocating(folder, mixed_precisions(3, 8, 0), "for 2 MoE layers x 8 experts, got shape (3, 8)")
    _refused_before_allocating(folder, mixed_precisions(2, 16, 0), "got shape (2, 16)")
    _refused_before_allocating(folder, None, "got shape None")


def test_greedy_text_at_an_auto_plans_precisions_through_dynamic_swaps_equals_transformers(plain, tmp_path):
    from hotsplit_runtime.hf.capture import Generation
    from hotsplit_runtime.hf.steps import CheckpointEngine, CheckpointMoE

    from hotsplit_cli.config.knobs import resolve_knobs
    from hotsplit_cli.hotset.windows import StoredLayers
    from tests.fakes.hf import reference_texts

    family = "deepseek_v3"
    prompts = [SENTENCES[0], SENTENCES[3][:15]]
    hm, P = _auto_model(plain[family], seed=7)
    want = reference_texts(plain[family], prompts, 8,
                           weights=stored_reference(plain[family], tmp_path / "ref", P, hm.layer_ids))
    sizes = np.vectorize({"native": 400, "fp8": 110, "mxfp4": 60}.get)(P.astype(str)).astype(np.int64)
    hot_LE = np.stack([np.arange(hm.num_experts) < hm.num_experts // 2] * len(hm.banks))
    knobs = resolve_knobs({"dyn_steps": 2, "dyn_max_swaps": 2, "dyn_margin": 1.0}, env={})
    generation = Generation(hm, load_tokenizer(plain[family]), prompts, max_new_tokens=8, batch_size=1)
    engine = CheckpointEngine(CheckpointMoE(hm, cpu_without_triton(), hot_LE), generation, knobs, expert_bytes=0,
                              stored=StoredLayers(P, sizes))
    summary = engine.run(math.inf, lambda r: None)
    assert summary.swaps > 0  # swaps really happened mid-generation (each within a precision, or MixedBank raises)
    assert generation.texts() == want


def test_triton_kernels_read_each_precisions_bank_of_a_mixed_layer_in_the_interpreter(triton_interpreted, plain,
                                                                                      tmp_path):
    import dataclasses

    info = dataclasses.replace(cpu_without_triton(), triton=True)
    hm, P = _auto_model(plain["qwen3_moe"], seed=11, info=info)
    assert all(s.kernel is not None for b in hm.banks for s in b.subs)
    batch = _batch(plain["qwen3_moe"])
    with torch.no_grad():
        want = reference(stored_reference(plain["qwen3_moe"], tmp_path / "ref", P, hm.layer_ids))(**batch).logits
    for b in hm.banks:
        b.set_hot(np.arange(hm.num_experts) % 3 == 0)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    for b in hm.banks:
        _swap_within_precisions(b)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
