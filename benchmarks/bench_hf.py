"""Greedy generation on a Hugging Face checkpoint: hotsplit's banks vs plain transformers.

A random Qwen3-MoE-shaped checkpoint (made up, small enough for a CPU: hidden 256, 4 layers,
32 experts, top-4) is saved to a temporary folder and loaded twice: by transformers (its eager
and its default `grouped_mm` experts) and by hotsplit (experts in the cold bank, a share hot).
Each generates the same tokens; runs are interleaved in one process (every other round in reverse
order) and the median time of each is printed with its ratio to transformers' eager experts in the
same round: median and spread (min-max) over rounds. `--fp8` also saves a
block-scaled fp8 copy and times hotsplit on it (experts dequantised when computed).

    .venv/bin/python benchmarks/bench_hf.py [--fp8] [--hot 0.5] [--tokens 24] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import load_average, load_span  # noqa: E402

from hotsplit_cli.hotset.sizes import FP8_BLOCK  # noqa: E402

GEOMETRY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_experts=32,
                num_experts_per_tok=4, max_position_embeddings=512, tie_word_embeddings=False)


def save_random(folder: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **GEOMETRY), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 1.0)  # sharper routing, as trained routers are
    model.save_pretrained(folder)


def save_fp8(src: Path, dst: Path, block=FP8_BLOCK) -> None:
    import json
    import shutil

    from hotsplit_runtime.fp8 import Fp8Format, quantize
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                t = h.get_tensor(k)
                leaf = k.rsplit(".", 2)[-2] if k.endswith(".weight") else ""
                if t.dim() == 2 and "proj" in leaf:
                    tensors[k], tensors[k + "_scale_inv"] = quantize(t, Fp8Format(block))
                else:
                    tensors[k] = t
        f.unlink()
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (dst / "config.json").write_text(json.dumps(cfg))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hot", type=float, default=0.5, help="share of each layer's experts kept hot")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per sequence")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5, help="timed rounds, after one warm-up round")
    ap.add_argument("--fp8", action="store_true")
    args = ap.parse_args()

    from hotsplit_runtime.device import choose_device, tune_cpu_threads
    from hotsplit_runtime.hf.loader import load_model
    from transformers import AutoModelForCausalLM

    info = choose_device("auto")
    tune_cpu_threads(info)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        save_random(folder)
        runners = {}
        for impl in ("eager", "grouped_mm"):
            m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, experts_implementation=impl)
            runners[f"transformers ({impl} experts)"] = m.eval().to(info.device)
        models = [("hotsplit", folder)]
        if args.fp8:
            save_fp8(folder, Path(tmp) / "fp8")
            models.append(("hotsplit fp8", Path(tmp) / "fp8"))
        for label, path in models:
            hm = load_model(path, info, torch.float32)
            rng = np.random.default_rng(0)
            for b in hm.banks:
                b.set_hot(rng.random(hm.num_experts) < args.hot)
            hm.counter.begin_step(None)
            runners[f"{label} ({100 * args.hot:.0f}% hot)"] = hm.model
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(3, GEOMETRY["vocab_size"], (args.batch, 16), generator=gen).to(info.device)
        kw = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
        times: dict[str, list[float]] = {k: [] for k in runners}
        outputs = {}
        load = load_average()
        with torch.no_grad():
            for r in range(args.reps + 1):  # the first round warms up and is dropped
                for name, model in (list(runners.items()) if r % 2 else list(runners.items())[::-1]):
                    t0 = time.perf_counter()
                    outputs[name] = model.generate(input_ids=ids, **kw)
                    times[name].append(time.perf_counter() - t0)
    base = times["transformers (eager experts)"][1:]
    want = outputs["transformers (eager experts)"]
    n_tok = args.batch * args.tokens
    print(f"qwen3_moe-shaped random checkpoint on {info.name}: {GEOMETRY['num_hidden_layers']} layers, hidden "
          f"{GEOMETRY['hidden_size']}, {GEOMETRY['num_experts']} experts top-{GEOMETRY['num_experts_per_tok']}; "
          f"batch {args.batch} x {args.tokens} new tokens, median of {args.reps} rounds (ratio: min-max over rounds); "
          f"{load_span(load)}")
    print("| model | ms | tokens/s | time / transformers eager | same tokens |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name in runners:
        t = statistics.median(times[name][1:])
        ratios = [a / b for a, b in zip(times[name][1:], base, strict=True)]
        same = "yes" if torch.equal(outputs[name], want) else "no"
        if "fp8" in name:
            same = "n/a (quantised weights)"
        print(f"| {name} | {1e3 * t:.1f} | {n_tok / t:.1f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {same} |")


if __name__ == "__main__":
    main()
