"""Build a tiny random Qwen3-MoE checkpoint folder (config.json, safetensors weights, tokenizer)
and a prompts file, to walk through `hotsplit recipe`, `balance`, `plan`, `run` and `export`
on a checkpoint of your own without downloading one. Needs the `[hf]` extra:
`.venv/bin/pip install -e '.[hf]'`.

    .venv/bin/python examples/tiny_checkpoint.py my-ckpt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

TEXT = ["Mixture of experts models route every token to a few experts.",
        "Hot experts live in GPU memory; cold experts are read over PCIe.",
        "The quick brown fox jumps over the lazy dog.", "Pack my box with five dozen liquor jugs."]
# Made-up tiny geometry with Qwen3-MoE's structure: 4 layers, the first dense, 16 experts, top-4.
GEOMETRY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=4, mlp_only_layers=[0], num_experts=16, num_experts_per_tok=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def build(folder: Path) -> None:
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_moe", **GEOMETRY)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():  # sharper routers than the initialiser's: a skewed histogram, as real ones are
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 1.0)
    model.save_pretrained(folder)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXT * 4, vocab_size=GEOMETRY["vocab_size"], min_frequency=1,
                            special_tokens=["<pad>", "<s>", "</s>"])
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
    prompts = folder.parent / f"{folder.name}-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXT))
    print(f"wrote {folder}/ and {prompts}")


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "my-ckpt"))
