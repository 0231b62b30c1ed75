"""A checkpoint's routed experts stored at fp8 or mxfp4 (the `precision` knob): quantised once as
the cold bank fills, hot copies the same bytes, and the runtime computes what transformers
computes on the same checkpoint with every routed expert weight replaced by its stored value read
back (quantised, then dequantised, by the test below, projection by projection)."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from hotsplit_runtime.fp8 import Fp8Format, dequantize, quantize  # noqa: E402
from hotsplit_runtime.hf.loader import FAMILIES, load_model, load_tokenizer  # noqa: E402
from hotsplit_runtime.precision import RELEASE_FP8, mxfp4_dequantize, mxfp4_quantize  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from hotsplit_cli.core.errors import UsageError  # noqa: E402
from tests.conftest import cpu_without_triton  # noqa: E402
from tests.fakes.hf import FAMILY_KW, SENTENCES, build_checkpoint, mxfp4_release, reference  # noqa: E402

PRECISIONS = ("fp8", "mxfp4")
_PER_EXPERT = re.compile(r"layers\.(\d+)\..*experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_FUSED = re.compile(r"layers\.(\d+)\..*experts\.(gate_up_proj|down_proj)$")


def read_back(w_RC: torch.Tensor, precision: str) -> torch.Tensor:
    """W [out, in] stored at `precision` and read back in float32."""
    if precision == "fp8":
        return dequantize(*quantize(w_RC, RELEASE_FP8), RELEASE_FP8, torch.float32)
    return mxfp4_dequantize(*mxfp4_quantize(w_RC), torch.float32)


def stored_reference(src, out, precision, layer_ids=()):
    """`src` with each routed expert weight as stored at its precision and read back: `precision`
    one for every expert, or str [L, E] per expert of the MoE layers `layer_ids` (an auto plan).
    Per-expert projections each on its own; gpt-oss's fused [E, in, out] tensors per expert as
    [out, in], gate and up rows (the first and second half) apart, as their fp8 scales are."""
    row = {lid: i for i, lid in enumerate(layer_ids)}

    def stored(w_RC, layer, e):
        p = precision if isinstance(precision, str) else precision[row[layer], e]
        return w_RC if p == "native" else read_back(w_RC, p)

    shutil.copytree(src, out)
    tensors = load_file(out / "model.safetensors")
    for key, t in tensors.items():
        if m := _PER_EXPERT.search(key):
            tensors[key] = stored(t, int(m[1]), int(m[2]))
        elif m := _FUSED.search(key):
            experts = []
            for e, w in enumerate(t.transpose(1, 2)):  # [out, in] per expert
                half = w.shape[0] // 2
                parts = (w[:half], w[half:]) if m[2] == "gate_up_proj" else (w,)
                experts.append(torch.cat([stored(part, int(m[1]), e) for part in parts]))
            tensors[key] = torch.stack(experts).transpose(1, 2).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def groupable_checkpoints(root, families) -> dict:
    """A tiny checkpoint of each family whose expert dims mxfp4 can group (moe_intermediate 32)."""
    return {f: build_checkpoint(root / f, f, **({"moe_intermediate_size": 32}
                                                 if "moe_intermediate_size" in FAMILY_KW[f] else {}))
            for f in families}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return groupable_checkpoints(tmp_path_factory.mktemp("stored"), FAMILIES)


@pytest.fixture(scope="module")
def references(plain, tmp_path_factory):
    root = tmp_path_factory.mktemp("stored_ref")
    return {(f, p): stored_reference(plain[f], root / f"{f}-{p}", p) for f in FAMILIES for p in PRECISIONS}


def _batch(folder):
    tok = load_tokenizer(folder)
    tok.padding_side = "left"
    enc = tok([SENTENCES[3], SENTENCES[4][:12]], return_tensors="pt", padding=True)
    return dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])


def _logits(hm, batch):
    with torch.no_grad():
        return hm.model(**batch).logits


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_stored_at_a_precision_equals_transformers_on_its_read_back_weights(plain, references, family,
                                                                                         precision):
    batch = _batch(plain[family])
    with torch.no_grad():
        want = reference(references[family, precision])(**batch).logits
    cpu = cpu_without_triton()
    hm = load_model(plain[family], cpu, torch.float32, precision=precision)
    native = load_model(plain[family], cpu, torch.float32)
    bank = hm.banks[0]
    assert {b.precision for b in hm.banks} == {precision} and bank.cold_EB.dtype == torch.uint8
    assert bank.blob_layout.stored_bytes < native.banks[0].blob_layout.stored_bytes / 3  # float32: 4 B a weight
    E = hm.num_experts
    for hot in (np.zeros(E, bool), np.arange(E) % 2 == 0):
        for b in hm.banks:
            b.set_hot(hot)
        torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    for b in hm.banks:  # swaps move the stored bytes: every hot expert leaves for a cold one
        for out_e, in_e in zip(range(0, E, 2), range(1, E, 2), strict=True):
            b.swap(out_e, in_e)
        for slot, e in enumerate(b.table.slot2expert_S.tolist()):
            assert torch.equal(b.hot_SB[slot], b.cold_EB[e])
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_balance_measures_the_bytes_a_run_stores(plain, family, precision):
    """The weights `balance --model` measures an expert's error on are bit for bit the ones a run
    at that precision reads back (gpt-oss's interleaved gate/up rows included)."""
    from hotsplit_runtime.hf.quality import quantised

    cpu = cpu_without_triton()
    stored = load_model(plain[family], cpu, torch.float32, precision=precision)
    native = load_model(plain[family], cpu, torch.float32)
    for row, bank in enumerate(native.banks):
        for e in range(native.num_experts):
            q1, q2 = quantised(native.layers[row].experts, bank.weights_of(e), precision, torch.float32)
            run = stored.banks[row].weights_of(e)
            assert torch.equal(q1, run["w1"].cpu()) and torch.equal(q2, run["w2"].cpu()), (row, e)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3", "gpt_oss"])
def test_greedy_text_at_a_stored_precision_through_dynamic_swaps_equals_transformers(plain, references, family,
                                                                                     precision):
    from hotsplit_runtime.hf.capture import Generation
    from hotsplit_runtime.hf.steps import CheckpointEngine, CheckpointMoE

    from hotsplit_cli.config.knobs import resolve_knobs
    from tests.fakes.hf import reference_texts

    prompts = [SENTENCES[0], SENTENCES[3][:15]]
    want = reference_texts(plain[family], prompts, 8, weights=references[family, precision])
    cpu = cpu_without_triton()
    hm = load_model(plain[family], cpu, torch.float32, precision=precision)
    for bank in hm.banks:
        bank.set_hot(np.arange(hm.num_experts) < hm.num_experts // 2)
    knobs = resolve_knobs({"dyn_steps": 2, "dyn_max_swaps": 2, "dyn_margin": 1.0}, env={})
    generation = Generation(hm, load_tokenizer(plain[family]), prompts, max_new_tokens=8, batch_size=1)
    engine = CheckpointEngine(CheckpointMoE(hm, cpu), generation, knobs, expert_bytes=hm.banks[0].expert_bytes)
    summary = engine.run(math.inf, lambda r: None)
    assert summary.swaps > 0  # swaps really happened mid-generation
    assert generation.texts() == want


@pytest.mark.parametrize("precision", ["fp8", "mxfp4"])
def test_triton_kernels_read_the_experts_quantised_at_load_in_the_interpreter(triton_interpreted, plain,
                                                                              references, precision):
    import dataclasses

    batch = _batch(plain["qwen3_moe"])
    with torch.no_grad():
        want = reference(references["qwen3_moe", precision])(**batch).logits
    hm = load_model(plain["qwen3_moe"], dataclasses.replace(cpu_without_triton(), triton=True), torch.float32,
                    precision=precision)
    assert all(b.kernel is not None and b.precision == precision for b in hm.banks)
    for b in hm.banks:
        b.set_hot(np.arange(hm.num_experts) % 3 == 0)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)


def test_an_fp8_release_stored_at_mxfp4_is_dequantised_then_quantised(plain, tmp_path):
    """Each value is rounded twice: the reference reads the fp8 release back, then stores that at mxfp4."""
    from tests.runtime.test_hf_fp8 import write_fp8

    fp8_dir, deq_dir = tmp_path / "fp8", tmp_path / "deq"
    write_fp8(plain["deepseek_v3"], fp8_dir, Fp8Format((8, 12)), deq_dir)
    batch = _batch(fp8_dir)
    with torch.no_grad():
        want = reference(stored_reference(deq_dir, tmp_path / "ref", "mxfp4"))(**batch).logits
    hm = load_model(fp8_dir, cpu_without_triton(), torch.float32, precision="mxfp4")
    assert {b.precision for b in hm.banks} == {"mxfp4"}
    for b in hm.banks:
        b.set_hot(np.arange(hm.num_experts) % 2 == 1)
    torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-4, atol=1e-5)
    kept = load_model(fp8_dir, cpu_without_triton(), torch.float32, precision="fp8")  # fp8 stays as released
    assert kept.banks[0].layout.fp8 == Fp8Format((8, 12))


def _refused_before_allocating(monkeypatch, folder, precision):
    from hotsplit_runtime import pinned

    allocs = []
    monkeypatch.setattr(pinned.PinnedAllocator, "alloc", lambda self, n: allocs.append(n))
    with pytest.raises(UsageError) as e:
        load_model(folder, cpu_without_triton(), torch.float32, precision=precision)
    assert allocs == [] and "\n" not in str(e.value)
    return e.value


def test_an_mxfp4_release_at_fp8_is_refused_in_one_line_saying_why(checkpoints, tmp_path, monkeypatch):
    release = mxfp4_release(checkpoints["gpt_oss"], tmp_path / "gpt_oss")
    err = _refused_before_allocating(monkeypatch, release, "fp8")
    assert str(err) == (f"{release}: precision fp8: the checkpoint's experts are released in mxfp4, and fp8 would "
                        "store them in about twice the bytes with no more accuracy than the release")
    assert err.hint == "run it at precision native or mxfp4 (both: as released)"


def test_mxfp4_on_expert_dims_it_cannot_group_is_refused_naming_the_dim(checkpoints, monkeypatch):
    err = _refused_before_allocating(monkeypatch, checkpoints["qwen3_moe"], "mxfp4")  # moe_intermediate 16
    assert str(err) == ("Qwen3MoeExperts: precision mxfp4 needs expert input dims divisible by 32, got hidden 32 and "
                        "moe_intermediate 16")


def greedy_tokens(folder, prompts: list[str], new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens on `folder` for each prompt on its own (what a run generates)."""
    tok, ref = load_tokenizer(folder), reference(folder)
    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        seq = ref.generate(input_ids=ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        out.append(seq[0, ids.shape[1]:].tolist())
    return out


def teacher_forced_agreement(native, prompts: list[str], generated: list[list[int]]) -> tuple[float, int]:
    """transformers on `native` fed each prompt and its `generated` tokens: the fraction of those
    tokens that is its own greedy choice at their position, and how many were compared."""
    tok, ref = load_tokenizer(native), reference(native)
    agree = total = 0
    for prompt, gen in zip(prompts, generated, strict=True):
        ids = tok(prompt)["input_ids"]
        with torch.no_grad():
            chosen = ref(input_ids=torch.tensor([ids + gen])).logits[0, len(ids) - 1:-1].argmax(-1)
        agree += int((chosen == torch.tensor(gen)).sum())
        total += len(gen)
    return agree / total, total


def test_native_agreement_counts_the_tokens_the_release_also_chooses(plain):
    """The native greedy tokens with the last two of each prompt changed: each changed token is a
    miss, counted as transformers computes it here."""
    from hotsplit_runtime.hf.agreement import native_agreement

    folder, prompts = plain["olmoe"], [SENTENCES[1], SENTENCES[4]]
    generated = [g[:-2] + [(t + 1) % 320 for t in g[-2:]] for g in greedy_tokens(folder, prompts, 8)]
    want, tokens = teacher_forced_agreement(folder, prompts, generated)
    got = native_agreement(folder, cpu_without_triton(), torch.float32, prompts, generated)
    assert 0 < want <= 0.75 and got.tokens == tokens == 16 and got.note is None
    assert got.agreement == pytest.approx(want)


def test_run_at_mxfp4_reports_its_agreement_with_native_next_to_the_plans_expected_error(plain, references, tmp_path,
                                                                                         cli):
    import json

    import orjson

    from tests.cli.test_run_hf import _geometry, _recipe

    folder, prompts = plain["qwen3_moe"], [SENTENCES[0], SENTENCES[2]]
    lines = tmp_path / "p.jsonl"
    lines.write_text("".join(orjson.dumps({"prompt": p}).decode() + "\n" for p in prompts))
    recipe = str(_recipe(tmp_path, folder, lines, 8, _geometry(folder)))
    hist = tmp_path / "hist.json"
    assert cli("balance", recipe, "-o", str(hist)).code == 0
    doc = json.loads(hist.read_text())  # errors as `balance` records them: mxfp4 0.05 for every expert
    rows = len(doc["counts"])
    doc["quality"] = {"measured_on": "test", "model": {},
                      "expert_error": {p: [[e] * 8 for _ in range(rows)] for p, e in (("fp8", 0.01), ("mxfp4", 0.05))}}
    hist.write_text(json.dumps(doc))
    plan = tmp_path / "plan.json"
    assert cli("plan", str(hist), "-r", recipe, "--precision", "mxfp4", "-o", str(plan)).code == 0
    r = cli("run", recipe, "--plan", str(plan), "--precision", "mxfp4", "--json")
    assert r.code == 0, r.err
    run = json.loads(r.out)
    assert run["texts"] == reference_texts_of(folder, prompts, references["qwen3_moe", "mxfp4"])
    generated = greedy_tokens(references["qwen3_moe", "mxfp4"], prompts, 6)  # the run's tokens
    agreement, tokens = teacher_forced_agreement(folder, prompts, generated)
    assert run["precision"] == {"stored": "mxfp4", "expected_error": pytest.approx(0.05), "tokens": tokens,
                                "agreement": pytest.approx(agreement), "note": None}
    assert run["plan"]["expert_bytes"] == run["allocated"]["cold_bank_bytes"] // (8 * rows)  # stored bytes counted
    human = cli("run", recipe, "--plan", str(plan), "--precision", "mxfp4")
    assert re.search(rf"precision mxfp4\s+next-token agreement with native {100 * agreement:.2f}% of {tokens} "
                     r"tokens \(teacher-forced\); expected error 0\.0500", human.out)


def reference_texts_of(folder, prompts, weights):
    from tests.fakes.hf import reference_texts

    return reference_texts(folder, prompts, 6, weights=weights)


@pytest.mark.slow
def test_ep2_at_fp8_and_mxfp4_with_swaps_mid_run_generates_the_read_back_weights_text(plain, references, tmp_path):
    """ep 2, a swap in every layer every 2 steps: each rank's hot copies and the node's shared cold
    bank hold the experts quantised once, by the rank that fills the bank."""
    from tests.fakes.hf import reference_texts
    from tests.runtime.test_hf_ep import NEW_TOKENS, PROMPTS, _run

    folder = plain["deepseek_v3"]
    job = _run(tmp_path, 2, {p: folder for p in PRECISIONS}, swap_every=2, precision={p: p for p in PRECISIONS})
    for precision, got in job.items():
        want = reference_texts(folder, PROMPTS, NEW_TOKENS, weights=references["deepseek_v3", precision])
        assert got["texts"] == want, precision
        assert all(n > 0 for n in got["swaps_R"]), precision  # every rank swapped mid-generation


def test_run_at_mxfp4_on_dims_it_cannot_group_is_refused_in_one_line_and_writes_nothing(checkpoints, tmp_path, cli):
    import orjson

    from tests.cli.test_run_hf import _geometry, _recipe

    lines = tmp_path / "p.jsonl"
    lines.write_text(orjson.dumps({"prompt": SENTENCES[0]}).decode() + "\n")
    recipe = _recipe(tmp_path, checkpoints["qwen3_moe"], lines, 4, _geometry(checkpoints["qwen3_moe"]))
    log = tmp_path / "log.jsonl"
    r = cli("run", str(recipe), "--precision", "mxfp4", "--log-jsonl", str(log))
    assert r.code == 2 and r.out == "" and not log.exists()
    assert r.err.strip() == ("error: mxfp4 needs input dims divisible by 32 (one scale per 32 inputs), but recipe "
                             "'tiny-ckpt' has moe_intermediate_size / tp = 16; store its experts at fp8 or native")


def test_the_host_memory_checks_count_a_checkpoints_stored_bytes(plain, tmp_path, cli, monkeypatch):
    """Cold banks of 2 layers x 8 experts: 192 KiB at float32, 25.5 KiB at mxfp4. The loader's check
    (the host's available memory) and run's (the recipe's host memory) refuse the first only."""
    import psutil
    import yaml

    from hotsplit_cli.core.errors import RuntimeFailure
    from tests.cli.test_run_hf import _geometry, _recipe

    folder = plain["qwen3_moe"]
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 40_000})())
    with pytest.raises(RuntimeFailure, match="the cold banks need 192.00 KiB of host memory"):
        load_model(folder, cpu_without_triton(), torch.float32)
    hm = load_model(folder, cpu_without_triton(), torch.float32, precision="mxfp4")
    assert sum(b.cold_EB.numel() for b in hm.banks) == 2 * 8 * 1632 <= 0.8 * 40_000
    monkeypatch.undo()
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "Hi"}\n')
    recipe = _recipe(tmp_path, folder, lines, 2, _geometry(folder))
    doc = yaml.safe_load(recipe.read_text())  # fp32 as the checkpoint: 192 KiB native, 25.5 KiB mxfp4
    recipe.write_text(yaml.safe_dump({**doc, "hardware": {"host_mem_gib": 60_000 / 2**30}}))
    refused = cli("run", str(recipe), "--precision", "native")
    assert refused.code == 1 and "the cold banks need 0.00 GiB page-locked per node" in refused.err
    assert cli("run", str(recipe), "--precision", "mxfp4").code == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the kernels reading stored experts in place")
@pytest.mark.parametrize("precision", PRECISIONS)
def test_cuda_kernels_read_a_checkpoint_stored_at_load(tmp_path, precision):
    """On a GPU the Triton kernels read the quantised experts from the hot slots and, zero-copy,
    from the pinned cold bank: logits equal transformers on the read-back weights."""
    from hotsplit_runtime.device import choose_device

    folder = build_checkpoint(tmp_path / "q", "qwen3_moe", moe_intermediate_size=32)
    want_dir = stored_reference(folder, tmp_path / "ref", precision)
    info = choose_device("cuda")
    batch = {k: v.to(info.device) for k, v in _batch(folder).items()}
    with torch.no_grad():
        want = reference(want_dir).to(info.device)(**batch).logits
    hm = load_model(folder, info, torch.float32, precision=precision)
    assert all(b.kernel is not None and b.precision == precision and b.cold_read_EB.is_cuda for b in hm.banks)
    for hot in (np.zeros(hm.num_experts, bool), np.arange(hm.num_experts) % 3 == 0):
        for b in hm.banks:
            b.set_hot(hot)
        torch.testing.assert_close(_logits(hm, batch), want, rtol=1e-3, atol=1e-4)
