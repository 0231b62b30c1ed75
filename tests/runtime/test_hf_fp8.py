"""Block-scaled fp8 checkpoints (the DeepSeek-V3 / Qwen3-FP8 format) through hotsplit's loader.

A tiny random checkpoint is quantised the way those releases are (every linear weight but the
routers, embeddings and lm_head as float8_e4m3fn with one `weight_scale_inv` per block) and
saved twice: as fp8, and dequantised to float32. hotsplit on the fp8 one must compute what plain
transformers computes on the dequantised one, with the experts kept fp8 in the cold bank.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from hotsplit_runtime.device import choose_device  # noqa: E402
from hotsplit_runtime.fp8 import FP8, Fp8Format, dequantize, quantize  # noqa: E402
from hotsplit_runtime.hf.loader import load_model, load_tokenizer  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from tests.fakes.hf import SENTENCES, build_checkpoint, reference  # noqa: E402

# Blocks that do not divide every dimension (hidden 32, expert intermediate 16): the last block
# of a row or column is partial, as in real checkpoints whose sizes are not multiples of 128.
BLOCK = (8, 12)


def _quantised(name: str, t: torch.Tensor) -> bool:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
    return t.dim() == 2 and ("proj" in leaf or leaf in ("w1", "w2", "w3"))


def write_fp8(plain, fp8_dir, fmt: Fp8Format, deq_dir=None, scalar_scales: bool = False) -> dict:
    """Quantise the checkpoint `plain` into `fp8_dir` as the fp8 releases are (every linear weight
    but routers, embeddings and lm_head), with `deq_dir` (optional) holding the same weights
    dequantised to float32. Returns the fp8 checkpoint's tensors."""
    dirs = [d for d in (fp8_dir, deq_dir) if d is not None]
    for d in dirs:
        shutil.copytree(plain, d)
        for f in d.glob("*.safetensors"):
            f.unlink()
    fp8_t, deq_t = {}, {}
    for f in sorted(plain.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                t = h.get_tensor(k)
                if _quantised(k, t):
                    q, sc = quantize(t, fmt)
                    fp8_t[k], fp8_t[k + "_scale_inv"] = q, sc.reshape(()) if scalar_scales else sc
                    deq_t[k] = dequantize(q, sc, fmt, torch.float32)
                else:
                    fp8_t[k] = deq_t[k] = t
    save_file(fp8_t, str(fp8_dir / "model.safetensors"))
    if deq_dir is not None:
        save_file(deq_t, str(deq_dir / "model.safetensors"))
    cfg = json.loads((fp8_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if fmt.block is not None:
        cfg["quantization_config"]["weight_block_size"] = list(fmt.block)
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    return fp8_t


def fp8_pair(root, family: str):
    """(fp8 checkpoint, the same weights dequantised to float32) of a tiny `family` model."""
    plain = build_checkpoint(root / "plain", family)
    write_fp8(plain, root / "fp8", Fp8Format(BLOCK), root / "deq")
    return root / "fp8", root / "deq"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {f: fp8_pair(root / f, f) for f in ("deepseek_v3", "qwen3_moe")}


def _batch_and_reference(pair, texts):
    """A left-padded batch of `texts` and transformers' logits on the dequantised checkpoint."""
    fp8_dir, deq_dir = pair
    tok = load_tokenizer(fp8_dir)
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    batch = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    with torch.no_grad():
        return batch, reference(deq_dir)(**batch).logits


def _logits_for_hot_sets(hm, batch, hot_sets):
    for hot in hot_sets:
        for b in hm.banks:
            b.set_hot(hot)
        with torch.no_grad():
            yield hm.model(**batch).logits


def test_dequantize_multiplies_each_block_by_its_scale():
    w = torch.arange(6 * 5, dtype=torch.float32).view(6, 5).to(FP8)
    s = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])
    got = dequantize(w, s, Fp8Format((4, 3)), torch.float32)
    want = w.float() * torch.tensor([[1.0] * 3 + [10.0] * 2] * 4 + [[100.0] * 3 + [1000.0] * 2] * 2)
    assert torch.equal(got, want)
    assert torch.equal(dequantize(w, torch.tensor([2.0]), Fp8Format(None), torch.float32), w.float() * 2)
    with pytest.raises(ValueError, match="scale shape"):
        dequantize(w, s[:1], Fp8Format((4, 3)), torch.float32)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
def test_fp8_checkpoint_equals_transformers_on_the_dequantised_weights(pairs, family):
    batch, want = _batch_and_reference(pairs[family], [SENTENCES[1], SENTENCES[2][:20]])
    hm = load_model(pairs[family][0], choose_device("cpu"), torch.float32)
    bank = hm.banks[0]
    assert bank.layout.fp8 == Fp8Format(BLOCK) and bank.layout.plain_swiglu
    assert bank.kernel is None  # no Triton on this CPU process: dequantised per expert in torch
    assert bank.cold_EB.dtype == torch.uint8
    # An expert blob holds fp8 weights (1 byte each) and the float32 scales, 16-byte aligned:
    # gate/up [2 x 16, 32] + down [32, 16] = 1536 B; scales 2 x [2, 3] + [4, 2] floats = 80 B.
    assert bank.expert_bytes == 1536 + 80
    p = bank.parts_of(3)
    assert p["w1"].dtype == FP8 and p["s1"].shape == (2, 2, 3) and p["s2"].shape == (4, 2)
    E = hm.num_experts
    for got in _logits_for_hot_sets(hm, batch, (np.zeros(E, bool), np.arange(E) % 2 == 0, np.ones(E, bool))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
def test_fp8_triton_kernel_banks_equal_transformers_in_the_interpreter(triton_interpreted, pairs, family):
    """Where Triton runs, fp8 banks use the grouped kernels, which dequantise each tile as they read it."""
    import dataclasses

    batch, want = _batch_and_reference(pairs[family], [SENTENCES[3], SENTENCES[4][:12]])
    hm = load_model(pairs[family][0], dataclasses.replace(choose_device("cpu"), triton=True), torch.float32)
    assert all(b.kernel is not None and b.fp8_meta is not None for b in hm.banks)
    E = hm.num_experts
    for got in _logits_for_hot_sets(hm, batch, (np.zeros(E, bool), np.arange(E) % 3 == 0)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fp8_greedy_generation_identical_through_swaps(pairs):
    fp8_dir, deq_dir = pairs["deepseek_v3"]
    tok = load_tokenizer(fp8_dir)
    ids = tok(SENTENCES[0], return_tensors="pt")["input_ids"]
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    want = reference(deq_dir).generate(input_ids=ids, **kw)
    hm = load_model(fp8_dir, choose_device("cpu"), torch.float32)
    for b in hm.banks:
        b.set_hot(np.arange(hm.num_experts) < 4)
        b.swap(0, 7)
    hm.counter.begin_step(None)
    assert hm.model.generate(input_ids=ids, **kw).tolist() == want.tolist()


def test_fp8_checkpoint_missing_a_scale_is_refused(pairs, tmp_path):
    from hotsplit_cli.core.errors import InputFileError

    fp8_dir, _ = pairs["qwen3_moe"]
    broken = tmp_path / "broken"
    shutil.copytree(fp8_dir, broken)
    f = broken / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        tensors = {k: h.get_tensor(k) for k in h.keys()}
    gone = next(k for k in tensors if k.endswith("experts.5.down_proj.weight_scale_inv"))
    del tensors[gone]
    save_file(tensors, str(f))
    with pytest.raises(InputFileError, match="experts.5.down_proj.weight is fp8 but .*_scale_inv is missing"):
        load_model(broken, choose_device("cpu"), torch.float32)


def test_fp8_triton_kernels_dequantise_to_float16_for_16_bit_dots_in_the_interpreter(triton_interpreted, pairs):
    """With float16 activations the kernels dequantise each fp8 tile to float16 and multiply on
    tensor cores (on a GPU); the same function as the torch path, to float16 rounding."""
    import dataclasses

    fp8_dir, _ = pairs["qwen3_moe"]
    tok = load_tokenizer(fp8_dir)
    ids = tok(SENTENCES[2], return_tensors="pt")["input_ids"]
    torch_path = load_model(fp8_dir, choose_device("cpu"), torch.float16)
    kernel_path = load_model(fp8_dir, dataclasses.replace(choose_device("cpu"), triton=True), torch.float16)
    assert kernel_path.banks[0].kernel.native_dot(torch.float16)
    for hm in (torch_path, kernel_path):
        for b in hm.banks:
            b.set_hot(np.arange(hm.num_experts) % 2 == 1)
    with torch.no_grad():
        want = torch_path.model(input_ids=ids).logits.float()
        got = kernel_path.model(input_ids=ids).logits.float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_fp8_scale_of_the_wrong_shape_is_refused_naming_the_weight(pairs, tmp_path):
    from hotsplit_cli.core.errors import InputFileError

    fp8_dir, _ = pairs["deepseek_v3"]
    for victim in ("self_attn.o_proj.weight_scale_inv", "experts.2.gate_proj.weight_scale_inv"):
        broken = tmp_path / victim.split(".")[1]
        shutil.copytree(fp8_dir, broken)
        f = broken / "model.safetensors"
        with safe_open(str(f), framework="pt") as h:
            tensors = {k: h.get_tensor(k) for k in h.keys()}
        key = next(k for k in tensors if k.endswith(victim))
        tensors[key] = tensors[key][:1]  # one row of blocks short
        save_file(tensors, str(f))
        with pytest.raises(InputFileError, match=key.removesuffix("_scale_inv").replace(".", "\\.")):
            load_model(broken, choose_device("cpu"), torch.float32)


def test_fp8_per_tensor_scales_stored_as_scalars(tmp_path):
    """Without weight_block_size each weight has one scale, which checkpoints store as a scalar."""
    fp8_dir = tmp_path / "fp8"
    tensors = write_fp8(build_checkpoint(tmp_path / "plain", "qwen3_moe"), fp8_dir, Fp8Format(None), scalar_scales=True)
    hm = load_model(fp8_dir, choose_device("cpu"), torch.float32)
    assert hm.banks[0].layout.fp8 == Fp8Format(None)
    key = next(k for k in tensors if k.endswith("experts.3.down_proj.weight"))
    want = tensors[key].float() * tensors[key + "_scale_inv"]
    layer = int(key.split("layers.")[1].split(".")[0])
    got = hm.banks[hm.layer_ids.index(layer)].weights_of(3)["w2"]
    assert torch.equal(got, want)
