"""Tiny random Hugging Face checkpoints of every supported family, built offline (config ->
random weights -> save_pretrained, and a byte-level BPE tokenizer trained on a few sentences),
and the plain transformers model they are compared with."""

from __future__ import annotations

import torch

VOCAB = 320
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Mixture of experts models route every token to a few experts.",
    "Hot experts live in GPU memory; cold experts are read over PCIe.",
    "Pack my box with five dozen liquor jugs.",
    "How vexingly quick daft zebras jump!",
]
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False)
# Geometry is made up (tiny); each keeps its family's structure: dense first layers, shared
# experts, group-limited sigmoid routers, gpt-oss's interleaved gate/up with biases.
FAMILY_KW = {
    "qwen3_moe": dict(moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, head_dim=8,
                      mlp_only_layers=[0]),
    "qwen2_moe": dict(moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                      shared_expert_intermediate_size=32),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
    "deepseek_v3": dict(num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                        n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_shared_experts=1),
    "glm4_moe": dict(moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                     first_k_dense_replace=1, head_dim=8, n_shared_experts=1),
    "mimo_v2_flash": dict(moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, head_dim=8, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}
EXPECTED_MOE_LAYERS = {"qwen3_moe": (1, 2), "deepseek_v3": (1, 2), "glm4_moe": (1, 2), "mimo_v2_flash": (1, 2)}


def build_tokenizer(folder):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 4, vocab_size=VOCAB, min_frequency=1,
                            special_tokens=["<pad>", "<s>", "</s>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>")
    tok.save_pretrained(folder)
    return tok


def build_checkpoint(folder, family: str, seed: int = 0, **geometry):
    """A random tiny checkpoint of `family` in `folder` (fp32 weights); `geometry`: config fields
    that differ from the family's tiny ones."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(family, **{**COMMON, **FAMILY_KW[family], **geometry})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger router weights: sharper, less tie-prone routing
        for name, p in model.named_parameters():
            if name.endswith(("gate.weight", "router.weight")):
                p.normal_(0, 1.0)
            elif "e_score_correction_bias" in name or name.endswith("router.bias"):
                p.uniform_(-0.1, 0.1)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder


def reference(folder, impl="eager"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, experts_implementation=impl).eval()


def reference_texts(folder, prompts: list[str], max_new_tokens: int, weights=None) -> list[str]:
    """transformers' greedy texts of each prompt on its own (`weights`: another folder of the same
    model's weights, e.g. an fp8 checkpoint's dequantised ones), as hotsplit decodes them."""
    from transformers import AutoTokenizer

    tok, ref = AutoTokenizer.from_pretrained(folder), reference(weights or folder)
    texts = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        out = ref.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


def mxfp4_release(folder, out):
    """`folder`'s gpt-oss checkpoint as gpt-oss is released: routed experts as MXFP4
    `*_blocks` [E, out, in/32, 16] and `*_scales` [E, out, in/32] (quantised by hotsplit's own
    codec, runtime/precision.py), everything else as it was, and config.json's quantization_config."""
    import json
    import shutil

    from hotsplit_runtime.precision import Mxfp4Experts
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    tensors = load_file(out / "model.safetensors")
    for key in [k for k in tensors if k.endswith("experts.gate_up_proj")]:
        down = key.replace("gate_up_proj", "down_proj")
        # the model's weights are [E, in, out]: the release packs [E, out, in]
        q = Mxfp4Experts.quantize(tensors.pop(key).transpose(1, 2), tensors.pop(down).transpose(1, 2))
        tensors.update({f"{key}_blocks": q.b13_EIGB, f"{key}_scales": q.s13_EIG,
                        f"{down}_blocks": q.b2_EHGB, f"{down}_scales": q.s2_EHG})
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg))
    return out
