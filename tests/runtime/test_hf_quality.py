"""The quality cost of stored precisions, measured while `balance` routes the prompts
(runtime/hf/quality.py), against an independent computation: transformers' own model generates
each prompt, a teacher-forced forward over the tokens it fed back captures the hidden states and
routing that reach each experts module, and each expert is recomputed there from the model's
expert tensors, quantised with the codecs directly."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from hotsplit_runtime.fp8 import Fp8Format  # noqa: E402
from hotsplit_runtime.hf.adapter import find_moe_layers  # noqa: E402
from hotsplit_runtime.hf.capture import count_routing  # noqa: E402
from hotsplit_runtime.precision import RELEASE_FP8, Mxfp4Experts  # noqa: E402

from tests.conftest import cpu_without_triton  # noqa: E402
from tests.fakes.hf import SENTENCES, build_checkpoint, mxfp4_release, reference  # noqa: E402
from tests.runtime.test_hf_fp8 import write_fp8  # noqa: E402

PROMPTS = SENTENCES[:3]
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def cpu():
    return cpu_without_triton()


def _measure(folder, cpu, quality=True):
    # one prompt per batch: transformers' generate below sees each prompt alone, unpadded
    return count_routing(folder, cpu, None, PROMPTS, NEW_TOKENS, 1, False, None, quality)


def _routed_inputs(folder):
    """Per MoE layer, (hidden states [T, H], top-k ids [T, K]) reaching its experts, captured by
    hooks on transformers' eager model teacher-forced on each prompt and its fed-back tokens."""
    from transformers import AutoTokenizer

    tok, ref = AutoTokenizer.from_pretrained(folder), reference(folder)
    layers = find_moe_layers(ref)
    seen = {i.row: [] for i in layers}
    with torch.no_grad():
        fed = [ref.generate(input_ids=tok(p, return_tensors="pt")["input_ids"], max_new_tokens=NEW_TOKENS,
                            do_sample=False, pad_token_id=0)[:, :-1] for p in PROMPTS]  # the last is never fed back
        hooks = [i.experts.register_forward_pre_hook(lambda m, a, row=i.row: seen[row].append(a[:2]))
                 for i in layers]
        for ids in fed:
            ref(input_ids=ids)
    for h in hooks:
        h.remove()
    return ref, layers, {row: [torch.cat(parts) for parts in zip(*s, strict=True)] for row, s in seen.items()}


def _independent_errors(folder, precision: str, fmt=None):
    """[L, E] errors ||Y_p - Y|| / ||Y|| over each expert's routed tokens, nan where none."""
    ref, layers, seen = _routed_inputs(folder)
    E = layers[0].num_experts
    err = np.full((len(layers), E), np.nan)
    for info in layers:
        mod = info.experts
        transposed = bool(getattr(mod, "is_transposed", False))
        x_TH, ids_TK = seen[info.row]
        for e in range(E):
            tok = (ids_TK == e).any(-1)
            if not tok.any():
                continue
            w1, w2 = mod.gate_up_proj[e].detach(), mod.down_proj[e].detach()
            b1 = mod.gate_up_proj_bias[e].detach() if getattr(mod, "has_bias", False) else None
            b2 = mod.down_proj_bias[e].detach() if getattr(mod, "has_bias", False) else None
            q1, q2 = _codec(w1, w2, precision, transposed, fmt)
            y, yq = (_run(mod, x_TH[tok], a, b, b1, b2, transposed) for a, b in ((w1, w2), (q1, q2)))
            err[info.row, e] = math.sqrt(float(((yq - y) ** 2).sum()) / float((y ** 2).sum()))
    return err


def _codec(w1, w2, precision, transposed, fmt):
    """The expert's weights through the codec at `precision`, back in the model's layout: w1's
    rows in the module's own order, as a run's bank stores them (interleaved gate/up included)."""
    o1, o2 = (w1.T, w2.T) if transposed else (w1, w2)  # [out, in]
    if precision == "mxfp4":
        q = Mxfp4Experts.quantize(o1[None], o2[None]).dequantized(torch.float32)
    else:
        q = (fmt or RELEASE_FP8).quantize_experts(o1[None], o2[None]).dequantized(torch.float32)
    q1, q2 = q[0][0], q[1][0]
    return (q1.T, q2.T) if transposed else (q1, q2)


def _run(mod, x, w1, w2, b1, b2, transposed):
    def lin(a, w, b):
        y = a @ w if transposed else a @ w.T
        return y if b is None else y + b
    return lin(mod._apply_gate(lin(x, w1, b1)), w2, b2).double()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    return {f: build_checkpoint(root / f, f) for f in ("qwen2_moe", "gpt_oss")}


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
def test_expert_errors_equal_an_independent_computation(folders, cpu, family):
    """qwen2_moe: shared experts (not measured: they are never stored apart), expert inputs of
    16 that mxfp4 cannot take; gpt-oss: transposed, interleaved gate/up, biases."""
    c = _measure(folders[family], cpu)
    q = c.quality
    want = ["fp8"] if family == "qwen2_moe" else ["fp8", "mxfp4"]
    assert sorted(q.error_LE) == want and q.native == "native"
    if family == "qwen2_moe":
        assert "divisible by 32" in q.skipped["mxfp4"]
    for p in want:
        expected = _independent_errors(folders[family], p)
        np.testing.assert_array_equal(np.isnan(q.error_LE[p]), c.counts_LE == 0)  # null: never routed
        np.testing.assert_allclose(q.error_LE[p], expected, rtol=1e-3, equal_nan=True)
        assert np.nanmin(q.error_LE[p]) > 0
        m = q.model[p]
        assert 0.0 <= m["agreement"] <= 1.0 and m["mean_kl"] >= 0.0 and m["tokens"] == c.tokens
    if family == "gpt_oss":  # 4 bits lose more than 8
        assert np.nanmedian(q.error_LE["mxfp4"]) > np.nanmedian(q.error_LE["fp8"])
        assert q.model["mxfp4"]["mean_kl"] > q.model["fp8"]["mean_kl"]


def test_measuring_changes_no_count(folders, cpu):
    """The hooks and the teacher-forced passes count nothing: the histogram is the same."""
    on, off = _measure(folders["gpt_oss"], cpu), _measure(folders["gpt_oss"], cpu, quality=False)
    np.testing.assert_array_equal(on.counts_LE, off.counts_LE)
    assert on.tokens == off.tokens and off.quality is None


def test_an_mxfp4_release_is_native_at_mxfp4_and_not_measured_at_fp8(folders, cpu, tmp_path):
    c = _measure(mxfp4_release(folders["gpt_oss"], tmp_path / "mx"), cpu)
    q = c.quality
    assert q.native == "mxfp4" and list(q.error_LE) == ["mxfp4"] and "fp8" in q.skipped
    np.testing.assert_array_equal(q.error_LE["mxfp4"], np.where(c.counts_LE > 0, 0.0, np.nan))
    assert q.model == {"mxfp4": {"agreement": 1.0, "mean_kl": 0.0, "tokens": c.tokens}}


def test_an_fp8_checkpoint_is_native_at_fp8_and_measured_at_mxfp4(cpu, tmp_path):
    """olmoe: per-expert tensors, expert inputs of 32 and 64 that mxfp4 takes; errors against
    the fp8 weights as stored."""
    fmt = Fp8Format((8, 12))
    write_fp8(build_checkpoint(tmp_path / "plain", "olmoe"), tmp_path / "fp8", fmt, tmp_path / "deq")
    c = _measure(tmp_path / "fp8", cpu)
    q = c.quality
    assert q.native == "fp8" and sorted(q.error_LE) == ["fp8", "mxfp4"]
    np.testing.assert_array_equal(q.error_LE["fp8"], np.where(c.counts_LE > 0, 0.0, np.nan))
    # mxfp4 of the stored fp8 weights: the dequantised checkpoint holds exactly those
    np.testing.assert_allclose(q.error_LE["mxfp4"], _independent_errors(tmp_path / "deq", "mxfp4"), rtol=1e-3,
                               equal_nan=True)
    assert q.model["fp8"]["agreement"] == 1.0 and 0.0 <= q.model["mxfp4"]["agreement"] <= 1.0


def test_padding_is_not_measured(folders, cpu):
    """Prompts batched (left-padded, rows finishing apart) measure what each alone measures."""
    alone = _measure(folders["gpt_oss"], cpu).quality
    batched = count_routing(folders["gpt_oss"], cpu, None, PROMPTS, NEW_TOKENS, len(PROMPTS), False, None, True)
    for p in ("fp8", "mxfp4"):
        np.testing.assert_allclose(batched.quality.error_LE[p], alone.error_LE[p], rtol=1e-3, equal_nan=True)
        assert batched.quality.model[p]["tokens"] == alone.model[p]["tokens"]


def test_a_layer_that_fills_its_buffer_is_measured_in_parts_to_the_same_errors(folders, cpu, monkeypatch):
    import hotsplit_runtime.hf.quality as quality

    whole = _measure(folders["gpt_oss"], cpu).quality
    monkeypatch.setattr(quality, "BUFFER_BYTES", 1)  # every forward's hidden states measured at once
    parts = _measure(folders["gpt_oss"], cpu).quality
    for p in ("fp8", "mxfp4"):
        np.testing.assert_allclose(parts.error_LE[p], whole.error_LE[p], rtol=1e-5, equal_nan=True)


def test_each_expert_is_quantised_once_per_precision_while_kept(folders, cpu, monkeypatch):
    """Quantising is what costs: an expert is quantised again only when the kept ones are full,
    and then the measurement is the same."""
    import hotsplit_runtime.hf.quality as quality

    calls = []
    codec = quality.quantised
    monkeypatch.setattr(quality, "quantised", lambda *a: calls.append(a[2]) or codec(*a))
    kept = _measure(folders["gpt_oss"], cpu)
    routed = int((kept.counts_LE > 0).sum())
    assert sorted(calls) == ["fp8"] * routed + ["mxfp4"] * routed
    calls.clear()
    monkeypatch.setattr(quality, "CACHE_BYTES", 0)
    again = _measure(folders["gpt_oss"], cpu)
    assert len(calls) > 2 * routed
    for p in ("fp8", "mxfp4"):
        np.testing.assert_array_equal(again.quality.error_LE[p], kept.quality.error_LE[p])
        assert again.quality.model[p] == kept.quality.model[p]
