"""Greedy generation on a loaded model as steps (a checkpoint run's), and exact routing counts.

A batch is left-padded; its prefill is one step and each greedy decode forward is one step.
Counted tokens: every real prompt token, and each generated token that is fed back while its
sequence is still running (a serving engine never runs the token after end-of-sequence, and
never a padding slot). So every layer's counts sum to counted tokens x top_k.

Shape letters: B = batch rows, S = sequence positions, L = MoE layers, T = tokens, K = top_k.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from hotsplit_cli.core.errors import RuntimeFailure
from hotsplit_cli.traffic.trace import Trace

from .loader import HFModel, load_model, load_tokenizer
from .lookahead import Lookahead, LookaheadCounter
from .quality import measure_quality


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


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class Forward:
    """One forward pass of the generation, run (and counted) when called: between two calls the
    caller may close a window, start swaps and publish the ones that landed."""

    def __init__(self, hm: HFModel, mask_T: torch.Tensor, **inputs):
        self.hm, self.mask_T, self.inputs = hm, mask_T, inputs

    @torch.no_grad()
    def __call__(self) -> np.ndarray:  # its routing counts [L, E] (also in `hm.counter`)
        self.hm.counter.begin_step(self.mask_T)
        self.out = self.hm.model(use_cache=True, **self.inputs)
        return self.hm.counter.end_step()


class Generation:
    """Greedy generation of `prompts` (all, or one rank's share) in batches of `batch_size`, one
    `Forward` a step (a batch's prefill, then each decode forward), each run by the caller before
    it asks for the next. `advance(n)` after each batch of n prompts; `ids`: each finished
    prompt's generated token ids (up to and including end-of-sequence)."""

    name = "prompts"

    def __init__(self, hm: HFModel, tokenizer, prompts: list, max_new_tokens: int, batch_size: int,
                 advance: Callable[[int], None] | None = None):
        self.hm, self.tokenizer, self.prompts = hm, tokenizer, prompts
        self.max_new_tokens, self.tokens_per_step, self.advance = max_new_tokens, batch_size, advance
        self.ids: list[list[int]] = []
        model = hm.model
        self.device = next(p for p in model.parameters() if p.numel()).device
        self.eos = _eos_ids(model, tokenizer).to(self.device)
        # transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` before).
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forwards(self) -> Iterator[Forward]:
        tok, batch = self.tokenizer, self.tokens_per_step
        tok.padding_side = "left"
        for start in range(0, len(self.prompts), batch):
            texts = [prompt_text(tok, p) for p in self.prompts[start:start + batch]]
            self.ids.extend((yield from self._batch(tok(texts, return_tensors="pt", padding=True))))
            if self.advance is not None:
                self.advance(len(texts))

    steps = forwards  # as a routing source of the loop

    def texts(self) -> list[str]:
        return [self.tokenizer.decode(x, skip_special_tokens=True) for x in self.ids]

    def _batch(self, enc) -> Generator[Forward, None, list[list[int]]]:
        device, eos, cache_kw = self.device, self.eos, self.cache_kw
        ids_BS, am_BS = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        pos_BS = (am_BS.cumsum(-1) - 1).clamp(min=0)
        step = Forward(self.hm, am_BS.reshape(-1).bool(), input_ids=ids_BS, attention_mask=am_BS, position_ids=pos_BS)
        yield step
        nxt_B = step.out.logits[:, -1].argmax(-1)
        alive_B = ~torch.isin(nxt_B, eos)
        gen = [[int(t)] for t in nxt_B.tolist()] if self.max_new_tokens > 0 else [[] for _ in range(len(nxt_B))]
        pos_B = pos_BS[:, -1]
        for _ in range(self.max_new_tokens - 1):  # the last generated token is never fed back
            if not bool(alive_B.any()):
                break
            am_BS = torch.cat([am_BS, torch.ones_like(am_BS[:, :1])], dim=1)
            pos_B = pos_B + 1
            step = Forward(self.hm, alive_B.clone(), input_ids=nxt_B[:, None], attention_mask=am_BS,
                           position_ids=pos_B[:, None], **{cache_kw: _cache_of(step.out)})
            yield step
            nxt_B = step.out.logits[:, -1].argmax(-1)
            for b in torch.nonzero(alive_B).flatten().tolist():
                gen[b].append(int(nxt_B[b]))
            alive_B = alive_B & ~torch.isin(nxt_B, eos)
        return gen


def capture(hm: HFModel, tokenizer, prompts: list, max_new_tokens: int, batch_size: int,
            advance: Callable[[int], None] | None = None) -> list[list[int]]:
    """Run every prompt's `Generation` with no serving (`hotsplit balance`, a run's calibration): counts
    land in `hm.counter` (and a trace when it keeps one)."""
    generation = Generation(hm, tokenizer, prompts, max_new_tokens, batch_size, advance)
    for forward in generation.forwards():
        forward()
    return generation.ids


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


@dataclass(frozen=True)
class CountedRouting:
    """What `hotsplit balance` counted on a checkpoint: counts [L, E], per step [S, L, E]."""

    counts_LE: np.ndarray
    steps_SLE: np.ndarray
    tokens: int
    top_k: int
    layer_ids: list[int]  # the model's layer index of each MoE layer
    family: str  # the checkpoint's model_type
    device_name: str
    trace: Trace | None  # the routing itself, when asked for
    quality: object | None = None  # hf/quality.py MeasuredQuality, when asked for
    lookahead: Lookahead | None = None  # router lookahead's counters (hf/lookahead.py), when asked for


def count_routing(model_dir, info, dtype: torch.dtype | None, prompts: list, max_new_tokens: int,
                  batch_size: int, keep_trace: bool, advance: Callable[[int], None] | None = None,
                  quality: bool = False, guesses: int | None = None) -> CountedRouting:
    """Load the checkpoint on `info`'s device and count the routing of greedy generation over
    `prompts`; every layer is checked to have counted tokens x top_k routed assignments.
    `quality`: also measure what fp8 and mxfp4 experts would cost (hf/quality.py). With
    `guesses`, router lookahead is measured too, widened to that many guesses per token."""
    hm = load_model(model_dir, info, dtype, keep_trace=keep_trace)
    tokenizer = load_tokenizer(model_dir)
    look = LookaheadCounter(hm, guesses) if guesses and len(hm.layers) > 1 else None

    def generate() -> list[list[int]]:
        ids = capture(hm, tokenizer, prompts, max_new_tokens, batch_size, advance)
        if look is not None:
            look.close()  # its counters stay; the quality passes below are not generation's routing
        return ids

    measured = None
    if quality:
        texts = [prompt_text(tokenizer, p) for p in prompts]
        measured = measure_quality(hm, tokenizer, generate, texts, batch_size, advance)[1]
    else:
        generate()
    c = hm.counter
    counts = c.counts_LE.astype(np.float64)
    expect = c.tokens * hm.top_k
    if np.any(counts.sum(axis=1) != expect):
        bad = int(np.flatnonzero(counts.sum(axis=1) != expect)[0])
        raise RuntimeFailure(f"layer {hm.layer_ids[bad]} counted {counts[bad].sum():.0f} routed assignments, "
                             f"expected {c.tokens} tokens x top_k {hm.top_k}")
    steps_SLE = np.stack(c.steps_SLE) if c.steps_SLE else np.zeros((0, *counts.shape))
    measured_on = f"{hm.family} checkpoint {model_dir}: {c.tokens} tokens of {len(prompts)} prompts, greedy"
    return CountedRouting(counts, steps_SLE, c.tokens, hm.top_k, hm.layer_ids, hm.family, info.name,
                          trace_of(hm) if keep_trace else None, measured,
                          look.result(measured_on) if look else None)
