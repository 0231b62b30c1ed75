"""Drive prompts through a loaded model and collect exact routing counts (`hotsplit balance`).

A batch is left-padded; its prefill is one step and each greedy decode forward is one step.
Counted tokens: every real prompt token, and each generated token that is fed back while its
sequence is still running (a serving engine never runs the token after end-of-sequence, and
never a padding slot). So every layer's counts sum to counted tokens x top_k.

Shape letters: B = batch rows, S = sequence positions, L = MoE layers, T = tokens, K = top_k.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch

from hotsplit_cli.traffic.trace import Trace

from .loader import HFModel


def prompt_text(tokenizer, prompt: str | list[dict]) -> str:
    """A chat (`messages`) goes through the tokenizer's chat template when it has one."""
    if isinstance(prompt, str):
        return prompt
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in prompt)


def _eos_ids(model, tokenizer) -> torch.Tensor:
    ids = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None)
        if eos is None:
            continue
        ids.update(eos if isinstance(eos, list | tuple) else [eos])
    return torch.tensor(sorted(ids), dtype=torch.long)


def _end_step(counter, on_step) -> None:
    step_LE = counter.end_step()
    if on_step is not None:
        on_step(step_LE)


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def capture(hm: HFModel, tokenizer, prompts: list, max_new_tokens: int, batch_size: int,
            advance: Callable[[int], None] | None = None,
            on_step: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
    """Run every prompt (prefill, then greedy decode up to `max_new_tokens` tokens) and count.

    Counts land in `hm.counter` (per step, and a trace when it keeps one); `on_step(step_LE)`
    runs between steps (where hot/cold swaps may happen). Returns each prompt's generated
    token ids (up to and including end-of-sequence)."""
    model, counter = hm.model, hm.counter
    device = next(p for p in model.parameters() if p.numel()).device
    eos = _eos_ids(model, tokenizer).to(device)
    tokenizer.padding_side = "left"
    generated: list[list[int]] = []
    # transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` before).
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for start in range(0, len(prompts), batch_size):
        texts = [prompt_text(tokenizer, p) for p in prompts[start:start + batch_size]]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        ids_BS = enc["input_ids"].to(device)
        am_BS = enc["attention_mask"].to(device)
        pos_BS = (am_BS.cumsum(-1) - 1).clamp(min=0)
        counter.begin_step(am_BS.reshape(-1).bool())
        out = model(input_ids=ids_BS, attention_mask=am_BS, position_ids=pos_BS, use_cache=True)
        _end_step(counter, on_step)
        cache = _cache_of(out)
        nxt_B = out.logits[:, -1].argmax(-1)
        alive_B = ~torch.isin(nxt_B, eos)
        gen = [[int(t)] for t in nxt_B.tolist()] if max_new_tokens > 0 else [[] for _ in texts]
        pos_B = pos_BS[:, -1]
        for _ in range(max_new_tokens - 1):  # the last generated token is never fed back
            if not bool(alive_B.any()):
                break
            am_BS = torch.cat([am_BS, torch.ones_like(am_BS[:, :1])], dim=1)
            pos_B = pos_B + 1
            counter.begin_step(alive_B.clone())
            out = model(input_ids=nxt_B[:, None], attention_mask=am_BS, position_ids=pos_B[:, None],
                        use_cache=True, **{cache_kw: cache})
            _end_step(counter, on_step)
            cache = _cache_of(out)
            nxt_B = out.logits[:, -1].argmax(-1)
            for b in torch.nonzero(alive_B).flatten().tolist():
                gen[b].append(int(nxt_B[b]))
            alive_B = alive_B & ~torch.isin(nxt_B, eos)
        generated.extend(gen)
        if advance is not None:
            advance(len(texts))
    return generated


def trace_of(hm: HFModel) -> Trace:
    """The captured steps as a trace [S, L, T_max, K]; shorter steps and uncounted tokens are -1."""
    steps = hm.counter.trace_steps
    if not steps:
        raise ValueError("no steps were captured with keep_trace=True")
    T = max(s.shape[1] for s in steps)
    L, K = steps[0].shape[0], steps[0].shape[2]
    ids = np.full((len(steps), L, T, K), -1, dtype=np.int16 if hm.num_experts < 2**15 else np.int32)
    for i, s in enumerate(steps):
        ids[i, :, :s.shape[1]] = s
    return Trace(ids, hm.layer_ids)
