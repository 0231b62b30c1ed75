"""Hugging Face checkpoints through hotsplit's experts implementation (runtime/hf).

Tiny random checkpoints of every supported family are built offline once per session
(config -> random weights -> save_pretrained, and a byte-level BPE tokenizer trained on a few
sentences), then loaded with hotsplit's loader (meta skeleton, experts straight into the cold
bank) and compared with plain transformers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0",
                                   reason="transformers>=5 (hotsplit[hf]) provides the experts interface")

from hotsplit_runtime.device import choose_device  # noqa: E402
from hotsplit_runtime.hf.capture import capture, trace_of  # noqa: E402
from hotsplit_runtime.hf.loader import FAMILIES, load_model, load_tokenizer  # noqa: E402

from tests.conftest import cpu_without_triton  # noqa: E402
from tests.fakes.hf import EXPECTED_MOE_LAYERS, SENTENCES, reference  # noqa: E402


@pytest.fixture(scope="session")
def cpu():
    return cpu_without_triton()


def router_counts(model, ids_BS, am_BS, moe_layers):
    """Counts from running each router directly (forward hooks on the routers), padding masked."""
    from hotsplit_runtime.hf.adapter import find_moe_layers

    layers = find_moe_layers(model)
    out = {}
    hooks = []
    for info in layers:
        def hook(mod, args, output, lid=info.layer_id):
            out[lid] = output[2].reshape(-1, output[2].shape[-1])
        hooks.append(info.router.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids=ids_BS, attention_mask=am_BS, position_ids=(am_BS.cumsum(-1) - 1).clamp(min=0))
    for h in hooks:
        h.remove()
    mask = am_BS.reshape(-1).bool()
    E = layers[0].num_experts
    return np.stack([torch.bincount(out[lid][mask].reshape(-1), minlength=E).numpy() for lid in moe_layers])


def _batch(tok, texts):
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_equal_routers_run_directly(checkpoints, cpu, family):
    folder = checkpoints[family]
    hm = load_model(folder, cpu, torch.float32)
    tok = load_tokenizer(folder)
    if family in EXPECTED_MOE_LAYERS:
        assert hm.layer_ids == EXPECTED_MOE_LAYERS[family]
    prompts = [SENTENCES[0], "Hi", SENTENCES[2]]  # very different lengths: left padding
    capture(hm, tok, prompts, max_new_tokens=0, batch_size=3)
    ids, am = _batch(tok, prompts)
    assert (am == 0).any()  # the batch really is padded
    direct = router_counts(reference(folder), ids, am, hm.layer_ids)
    np.testing.assert_array_equal(hm.counter.counts_LE, direct)
    assert hm.counter.tokens == int(am.sum())
    assert (hm.counter.counts_LE.sum(1) == hm.counter.tokens * hm.top_k).all()


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_padding_is_not_counted(checkpoints, cpu, family):
    folder = checkpoints[family]
    tok = load_tokenizer(folder)
    parts = []
    for group in ([SENTENCES[1]], ["Hi"], [SENTENCES[1], "Hi"]):
        hm = load_model(folder, cpu, torch.float32)
        capture(hm, tok, group, max_new_tokens=0, batch_size=2)
        parts.append(hm.counter.counts_LE)
    np.testing.assert_array_equal(parts[0] + parts[1], parts[2])


@pytest.mark.parametrize("family", ["mixtral", "glm4_moe"])
def test_decode_counts_exact_and_trace(checkpoints, cpu, family):
    folder = checkpoints[family]
    hm = load_model(folder, cpu, torch.float32, keep_trace=True)
    tok = load_tokenizer(folder)
    capture(hm, tok, SENTENCES[:3], max_new_tokens=5, batch_size=2)
    c = hm.counter
    assert len(c.steps_SLE) > 2  # prefill + decode steps of two batches
    assert (c.counts_LE.sum(1) == c.tokens * hm.top_k).all()
    tr = trace_of(hm)
    np.testing.assert_array_equal(tr.counts_LE(hm.num_experts), c.counts_LE)
    assert tr.layers == hm.layer_ids


def _hidden_batch(tok):
    return _batch(tok, [SENTENCES[3], SENTENCES[4][:12]])


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_for_hot_sets_and_swaps(checkpoints, cpu, family):
    folder = checkpoints[family]
    tok = load_tokenizer(folder)
    ids, am = _hidden_batch(tok)
    with torch.no_grad():
        want = reference(folder).forward(input_ids=ids, attention_mask=am).logits
        want_default = reference(folder, impl="grouped_mm").forward(input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(want_default, want, rtol=1e-4, atol=1e-5)
    hm = load_model(folder, cpu, torch.float32)
    rng = np.random.default_rng(0)
    E = hm.num_experts
    for trial in range(3):
        for bank in hm.banks:
            bank.set_hot(rng.random(E) < (0.0, 0.5, 1.0)[trial])
        with torch.no_grad():
            got = hm.model(input_ids=ids, attention_mask=am).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for bank in hm.banks:  # swaps: every hot expert leaves for a cold one, one at a time
        bank.set_hot(np.arange(E) < E // 2)
        for out_e, in_e in zip(range(E // 2), range(E // 2, E), strict=True):
            bank.swap(out_e, in_e)
        assert bank.hot_E.tolist() == [False] * (E // 2) + [True] * (E // 2)
    with torch.no_grad():
        got = hm.model(input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


PLAIN_SWIGLU = tuple(f for f in FAMILIES if f != "gpt_oss")  # gpt-oss: interleaved, biased, clamped


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_is_plain_swiglu_exactly_where_the_kernels_compute_it(checkpoints, cpu, family):
    from hotsplit_runtime.hf.bank import HFExpertBank

    hm = load_model(checkpoints[family], cpu, torch.float32)
    layout = hm.banks[0].layout
    assert layout.plain_swiglu == (family in PLAIN_SWIGLU)
    assert all(b.kernel is None for b in hm.banks)  # no Triton on this CPU process
    if family in PLAIN_SWIGLU:  # a blob is the synthetic runtime's: w1 [2I, H] then w2 [H, I]
        assert hm.banks[0].w2_offset == 2 * layout.inter * layout.hidden
    else:
        with pytest.raises(ValueError, match="plain SwiGLU"):
            HFExpertBank(layout, hm.num_experts, torch.float32, cpu, kernel=object())


@pytest.mark.parametrize("family", PLAIN_SWIGLU)
def test_triton_kernel_banks_equal_transformers_in_the_interpreter(triton_interpreted, checkpoints, cpu, family):
    """Where Triton runs, the loader gives plain-SwiGLU banks the expert-grouped kernels: the
    logits still equal transformers' for hot sets and through swaps."""
    import dataclasses

    folder = checkpoints[family]
    ids, am = _hidden_batch(load_tokenizer(folder))
    with torch.no_grad():
        want = reference(folder).forward(input_ids=ids, attention_mask=am).logits
    hm = load_model(folder, dataclasses.replace(cpu, triton=True), torch.float32)
    assert all(b.kernel is not None for b in hm.banks)
    E = hm.num_experts
    for hot in (np.zeros(E, bool), np.arange(E) % 2 == 0):
        for bank in hm.banks:
            bank.set_hot(hot)
        with torch.no_grad():
            got = hm.model(input_ids=ids, attention_mask=am).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for bank in hm.banks:
        bank.swap(0, 1)
        assert bank.served_E[1] >= 0 and bank.expert2slot_E[0] == -1
    with torch.no_grad():
        got = hm.model(input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_identical(checkpoints, cpu, family):
    folder = checkpoints[family]
    tok = load_tokenizer(folder)
    ids, am = _hidden_batch(tok)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    want = reference(folder).generate(input_ids=ids, attention_mask=am, **kw)
    hm = load_model(folder, cpu, torch.float32)
    for bank in hm.banks:
        bank.set_hot(np.arange(hm.num_experts) % 3 == 0)
    hm.counter.begin_step(None)
    got = hm.model.generate(input_ids=ids, attention_mask=am, **kw)
    assert got.tolist() == want.tolist()


def test_loader_refuses_tensors_of_another_shape_naming_them(checkpoints, cpu, tmp_path):
    """A config.json that does not describe its weights: refused, not broadcast or half-loaded."""
    import json
    import shutil

    from hotsplit_cli.core.errors import InputFileError

    for edit, key in ((dict(intermediate_size=48), r"layers\.0\.mlp\.(gate|up|down)_proj\.weight"),
                      (dict(moe_intermediate_size=8), r"layers\.\d\.mlp\.experts\.\d+\.(gate|up|down)_proj")):
        q = tmp_path / next(iter(edit))
        shutil.copytree(checkpoints["qwen3_moe"], q)
        cfg = json.loads((q / "config.json").read_text())
        (q / "config.json").write_text(json.dumps({**cfg, **edit}))
        with pytest.raises(InputFileError, match=key + ".*shape"):
            load_model(q, cpu)


def test_loader_refuses_cold_banks_larger_than_host_memory(checkpoints, cpu, monkeypatch):
    import psutil
    from hotsplit_runtime import pinned

    from hotsplit_cli.core.errors import RuntimeFailure

    allocs = []
    monkeypatch.setattr(pinned.PinnedAllocator, "alloc", lambda self, n: allocs.append(n))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 10_000})())
    # 2 MoE layers x 8 experts x 6144 B (fp32 gate/up [32, 32] + down [32, 16]) = 98,304 B > 0.8 x 10,000
    with pytest.raises(RuntimeFailure, match="the cold banks need 96.00 KiB of host memory, 9.77 KiB is available"):
        load_model(checkpoints["qwen3_moe"], cpu)
    assert allocs == []  # refused before anything was allocated


def test_loader_refuses_dense_weights_larger_than_the_free_device_memory(checkpoints, cpu, monkeypatch):
    import dataclasses

    from hotsplit_cli.core.errors import RuntimeFailure

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 10, 80 << 30))
    fake_gpu = dataclasses.replace(cpu, is_cuda=True, name="Fake GPU")
    with pytest.raises(RuntimeFailure, match=r"the weights that stay on the device \(attention, embeddings, dense and "
                       r"shared MLPs\) need .* on Fake GPU, 1.00 KiB is free"):
        load_model(checkpoints["qwen3_moe"], fake_gpu)


def test_loader_keeps_experts_out_of_the_model(checkpoints, cpu):
    hm = load_model(checkpoints["qwen3_moe"], cpu, torch.float32)
    for info in hm.layers:
        assert all(p.numel() == 0 for p in info.experts.parameters())
    assert not any(p.device.type == "meta" for p in hm.model.parameters())
    bank = hm.banks[0]
    assert bank.cold_EB.shape[0] == hm.num_experts
    assert bank.expert_bytes == 3 * 16 * 32 * 4  # gate, up [16, 32] and down [32, 16], fp32


def test_loader_refuses_unsupported(tmp_path, cpu, checkpoints):
    import json
    import shutil

    from hotsplit_cli.core.errors import InputFileError, UsageError

    q = tmp_path / "q"
    shutil.copytree(checkpoints["mixtral"], q)
    cfg = json.loads((q / "config.json").read_text())
    for qc, message in (({"quant_method": "awq", "bits": 4}, "quantised checkpoint \\(awq\\) is not supported"),
                        ({"quant_method": "gptq", "bits": 4}, "quantised checkpoint \\(gptq\\)"),
                        ({"quant_method": "fp8", "activation_scheme": "static"}, "static activation scales"),
                        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two"),
                        ({"quant_method": "fp8", "fmt": "e5m2"}, "fp8 format 'e5m2'")):
        cfg["quantization_config"] = qc
        (q / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UsageError, match=message):
            load_model(q, cpu)
    # Declared fp8, but the weights on disk are not: the experts cannot be read as fp8.
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [8, 8]}
    (q / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputFileError, match="holds torch.float8_e4m3fn, the checkpoint gives torch.float32"):
        load_model(q, cpu)
    cfg.pop("quantization_config")
    cfg["model_type"] = "llama"
    (q / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="not supported"):
        load_model(q, cpu)


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3"])
def test_bf16_matches_transformers_dtype_rules(checkpoints, cpu, family):
    """bf16 weights, with the routers transformers keeps in fp32 (DeepSeek's gate, score bias)."""
    from transformers import AutoModelForCausalLM

    folder = checkpoints[family]
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, experts_implementation="eager").eval()
    hm = load_model(folder, cpu, torch.bfloat16)
    want_dtypes = {n: p.dtype for n, p in ref.named_parameters()}
    for n, p in hm.model.named_parameters():
        if p.numel():
            assert p.dtype == want_dtypes[n], n
    for bank in hm.banks:
        bank.set_hot(np.arange(hm.num_experts) % 2 == 0)
    ids, am = _hidden_batch(load_tokenizer(folder))
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=am).logits
        got = hm.model(input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3", "gpt_oss"])
def test_serve_greedy_text_identical_through_dynamic_swaps(checkpoints, cpu, family):
    from hotsplit_runtime.hf.capture import Generation
    from hotsplit_runtime.hf.steps import CheckpointEngine, CheckpointMoE

    from hotsplit_cli.config.knobs import resolve_knobs

    folder = checkpoints[family]
    tok = load_tokenizer(folder)
    ref = reference(folder)
    prompts = [SENTENCES[0], SENTENCES[3][:15]]
    want = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        out = ref.generate(input_ids=ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        want.append(out[0, ids.shape[1]:].tolist())
    hm = load_model(folder, cpu, torch.float32)
    for bank in hm.banks:
        bank.set_hot(np.arange(hm.num_experts) < hm.num_experts // 2)
    knobs = resolve_knobs({"dyn_steps": 2, "dyn_max_swaps": 2, "dyn_margin": 1.0}, env={})
    records = []
    generation = Generation(hm, tok, prompts, max_new_tokens=8, batch_size=1)
    engine = CheckpointEngine(CheckpointMoE(hm, cpu), generation, knobs, expert_bytes=hm.banks[0].expert_bytes)
    summary = engine.run(math.inf, records.append)
    assert generation.texts() == [tok.decode(w, skip_special_tokens=True) for w in want]
    assert records and records == engine.book.records
    assert sum(r.swaps for r in records) > 0  # swaps really happened mid-generation
    assert summary.tokens == hm.counter.tokens
    assert summary.bytes_copied == sum(r.bytes_copied for r in records) > 0
    assert all((r.copy_ms > 0) == (r.swaps > 0) for r in records)  # each swap's copy is timed
    assert summary.copy_ms == pytest.approx(sum(r.copy_ms for r in records))
    assert summary.steps == records[-1].step and summary.hit_rate == records[-1].hit_rate_total
    for bank in hm.banks:  # nothing in flight on a CPU: what steps read is the target state
        assert (bank.served_hot_E == bank.hot_E).all()
        assert bank.expert2slot_E.tolist() == bank.served_E.tolist()
    assert records[-1].step == len(hm.counter.steps_SLE)
    for r in records:
        assert 0.0 <= r.hit_rate_window <= 1.0 and len(r.layer_hit_rate) == len(hm.layers)
    c = hm.counter.counts_LE
    assert (c.sum(1) == hm.counter.tokens * hm.top_k).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned cold bank read in place (UVA)")
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_cuda_cold_bank_zero_copy_matches_transformers(checkpoints, family):
    folder = checkpoints[family]
    info = choose_device("cuda")
    hm = load_model(folder, info, torch.float32)
    assert hm.banks[0].cold_EB.is_pinned() and hm.banks[0].cold_read_EB.is_cuda
    ids, am = _hidden_batch(load_tokenizer(folder))
    with torch.no_grad():
        want = reference(folder).to(info.device)(input_ids=ids.cuda(), attention_mask=am.cuda()).logits
        for hot in (np.zeros(hm.num_experts, bool), np.arange(hm.num_experts) % 2 == 0):
            for bank in hm.banks:
                bank.set_hot(hot)
            got = hm.model(input_ids=ids.cuda(), attention_mask=am.cuda()).logits
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


# A second checkpoint, then the first one again: a long-lived process loading checkpoint after
# checkpoint, each dropped before the next (a plain-SwiGLU family and gpt-oss's own layout).
RELOAD_ORDER = ("qwen3_moe", "gpt_oss", "qwen3_moe")


def _load_run_drop_in_turn(checkpoints, info, **tol):
    import gc

    for family in RELOAD_ORDER:
        folder = checkpoints[family]
        ids, am = (t.to(info.device) for t in _hidden_batch(load_tokenizer(folder)))
        with torch.no_grad():
            want = reference(folder).to(info.device)(input_ids=ids, attention_mask=am).logits
            hm = load_model(folder, info, torch.float32)
            for bank in hm.banks:
                bank.set_hot(np.arange(hm.num_experts) % 2 == 0)
            got = hm.model(input_ids=ids, attention_mask=am).logits
        torch.testing.assert_close(got, want, **tol)
        del hm, got, want
        gc.collect()  # the model, its banks and their allocator are gone
        # A large pageable host->device copy right after: the copy a registration left behind by
        # the dropped cold bank would make fail ("CUDA error: invalid argument").
        n_bytes = 64 << 20
        assert int(torch.ones(n_bytes, dtype=torch.uint8).to(info.device).sum()) == n_bytes


def test_load_run_drop_then_load_another_checkpoint(checkpoints, cpu):
    _load_run_drop_in_turn(checkpoints, cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned cold banks freed and made again")
def test_cuda_load_run_drop_then_load_another_checkpoint(checkpoints):
    _load_run_drop_in_turn(checkpoints, choose_device("cuda"), rtol=1e-3, atol=1e-4)


def test_a_rank_that_does_not_fill_the_shared_cold_bank_reads_only_the_dense_tensors(checkpoints, cpu):
    """An expert-parallel rank other than its node's filler maps the bank another rank writes:
    it reads no expert tensor (the bank stays as mapped, here zeros) and refuses none as missing."""
    from hotsplit_runtime.pinned import PinnedAllocator, numa_policy_for

    class Mapped(PinnedAllocator):
        fills = False

    folder = checkpoints["mixtral"]
    filled = load_model(folder, cpu, torch.float32)
    mapped = load_model(folder, cpu, torch.float32, allocator=Mapped(pin=False, numa=numa_policy_for("off", None)))
    assert all(float(b.cold_EB.abs().sum()) == 0.0 for b in mapped.banks)
    assert all(float(b.cold_EB.abs().sum()) > 0.0 for b in filled.banks)
    dense = dict(filled.model.named_parameters())
    for name, p in mapped.model.named_parameters():
        if p.numel():
            torch.testing.assert_close(p, dense[name], rtol=0, atol=0)
