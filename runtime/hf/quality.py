"""What storing a checkpoint's routed experts at fp8 or mxfp4 costs in quality, measured on the
prompts `hotsplit balance` routes (docs/precision.md, "Measured errors").

- Per expert, while the prompts are generated: a hook on each experts module keeps the hidden
  states that reach each expert, as routed (counted tokens only: no padding, no finished
  sequence), up to a bound per layer. Then each expert with tokens is run on them twice, with
  its native weights and with them quantised and dequantised at p. Its error is
  ||Y_p - Y|| / ||Y|| over all its routed tokens (Frobenius norm of the [tokens, H] outputs).
  The routing weight is left out: it scales a token's y and y_p alike.
- Per model, teacher-forced on the same tokens (each prompt, then its generated tokens that were
  fed back): every routed expert at p against native. Agreement is the fraction of counted
  positions whose greedy next token is the same; mean KL is KL(native || p) of the next-token
  distributions, averaged over those positions.

A checkpoint already stored quantised has that precision as native: its error there is 0, not
measured. A precision that would store more bytes than native (fp8 for an mxfp4 checkpoint) is
not measured, nor mxfp4 where the expert shapes cannot take it; `skipped` says why.

Shape letters: T = tokens, H = hidden, K = top_k, L = MoE layers, E = experts, B = batch rows,
S = sequence positions, V = vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from hotsplit_probes.cpu_expert import expert_groups

from hotsplit_cli.core.errors import RuntimeFailure
from hotsplit_cli.traffic.quality import MEASURED

from ..precision import MX_GROUP, stored_format
from .adapter import install
from .loader import HFModel

BUFFER_BYTES = 256 << 20  # hidden states kept for the error measurement, all layers together
CACHE_BYTES = 8 << 30  # experts kept quantised and read back (host memory), all precisions together


@dataclass(frozen=True)
class MeasuredQuality:
    """The measurement: errors [L, E] per precision (nan: never routed), each uniform precision's
    agreement and mean KL against native, and why a precision was left out."""

    error_LE: dict[str, np.ndarray]
    model: dict[str, dict]  # precision -> {"agreement", "mean_kl", "tokens"}
    native: str  # how the checkpoint stores its experts: native, fp8 or mxfp4
    skipped: dict[str, str]  # precision -> why it was not measured


def measurable(hm: HFModel) -> tuple[list[str], dict[str, str]]:
    """(the precisions to measure, {precision: why not} for the others)."""
    layout, native = hm.banks[0].layout, hm.banks[0].precision
    skipped = {}
    if native == "mxfp4":
        skipped["fp8"] = "the checkpoint stores mxfp4, which fp8 would only make larger"
    elif layout.hidden % MX_GROUP or layout.inter % MX_GROUP:
        skipped["mxfp4"] = (f"mxfp4 needs expert input dims divisible by {MX_GROUP}, got hidden {layout.hidden} "
                            f"and moe_intermediate {layout.inter}")
    return [p for p in MEASURED if p not in skipped and p != native], skipped


def quantised(experts: torch.nn.Module, weights: dict[str, torch.Tensor], precision: str,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's (w1, w2) (as `HFExpertBank.weights_of` gives them) stored at `precision` and
    read back, in host memory: the bytes a run at that precision stores (runtime/hf/bank.py
    `load_native`), so that the error measured is the error a run has. w1's rows are quantised in
    the module's own order, first and second half apart for fp8, as the bank scales them, even
    where gate and up rows interleave (gpt-oss). The codecs work on the host, as a bank is filled,
    and on [out, in], as they group inputs."""
    fmt = stored_format(precision)
    transposed = bool(getattr(experts, "is_transposed", False))
    w1, w2 = (weights["w1"].cpu(), weights["w2"].cpu())
    w1, w2 = (w1.T, w2.T) if transposed else (w1, w2)
    q1, q2 = (w[0] for w in fmt.quantize_experts(w1[None], w2[None]).dequantized(dtype))
    return (q1.T, q2.T) if transposed else (q1, q2)


class QuantisedWeights:
    """Experts' weights at a precision, each quantised once and kept in host memory while the
    kept ones fit in CACHE_BYTES (quantising an expert of a real model takes a large fraction of
    a second on a CPU; reading it back from here, nothing); beyond that, quantised again each
    time it is needed."""

    def __init__(self, hm: HFModel):
        self.hm = hm
        self.kept: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.kept_bytes = 0

    def of(self, row: int, e: int, precision: str) -> dict[str, torch.Tensor]:
        """Expert e of MoE layer `row` ready to compute with at `precision` (native: as stored)."""
        bank = self.hm.banks[row]
        w = bank.weights_of(e)
        if precision == "native":
            return w
        q = self.kept.get((precision, row, e))
        if q is None:
            q = quantised(self.hm.layers[row].experts, w, precision, bank.compute_dtype)
            size = sum(t.numel() * t.element_size() for t in q)
            if self.kept_bytes + size <= CACHE_BYTES:  # the first that fit stay: no churn on a cyclic walk
                self.kept[(precision, row, e)], self.kept_bytes = q, self.kept_bytes + size
        device = w["w1"].device
        return {**w, "w1": q[0].to(device), "w2": q[1].to(device)}

    def forget(self, precision: str) -> None:
        """Drop the experts kept at `precision` (no longer needed): room for another."""
        for key in [k for k in self.kept if k[0] == precision]:
            q = self.kept.pop(key)
            self.kept_bytes -= sum(t.numel() * t.element_size() for t in q)


def expert_output(experts: torch.nn.Module, w: dict[str, torch.Tensor], x_TH: torch.Tensor) -> torch.Tensor:
    """One expert on its tokens, as transformers' eager experts compute it: gate/up, the module's
    own `_apply_gate`, down (no routing weight)."""
    transposed = bool(getattr(experts, "is_transposed", False))

    def project(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = a @ weight if transposed else torch.nn.functional.linear(a, weight)
        return y if bias is None else y + bias

    return project(experts._apply_gate(project(x_TH, w["w1"], w.get("b1"))), w["w2"], w.get("b2"))


class ExpertErrors(contextlib.AbstractContextManager):
    """Per-expert output errors of the routed tokens, gathered by hooks on the experts modules
    while the model generates (installed on entry, removed on exit)."""

    def __init__(self, hm: HFModel, precisions: list[str], weights: QuantisedWeights):
        self.hm, self.precisions, self.weights = hm, precisions, weights
        L, E = len(hm.layers), hm.num_experts
        self.tokens_LE = np.zeros((L, E), dtype=np.int64)
        self.sq_ref_LE = np.zeros((L, E))
        self.sq_err_LE = {p: np.zeros((L, E)) for p in precisions}
        self.cap_bytes = BUFFER_BYTES // L  # per layer: flushed when it holds more
        self.kept: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(L)]
        self.kept_bytes = [0] * L
        self.handles = []

    def __enter__(self):
        for info in self.hm.layers:
            self.handles.append(info.experts.register_forward_pre_hook(self._hook(info.row)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _hook(self, row: int):
        def keep(module, args):
            x_TH, ids_TK = args[0], args[1]
            mask = self.hm.counter.token_mask_T
            if mask is not None:
                mask = mask.to(x_TH.device)
                x_TH, ids_TK = x_TH[mask], ids_TK[mask]
            self.kept[row].append((x_TH.detach().clone(), ids_TK.detach().clone()))
            self.kept_bytes[row] += x_TH.numel() * x_TH.element_size()
            if self.kept_bytes[row] >= self.cap_bytes:
                self.flush(row)
        return keep

    @torch.no_grad()
    def flush(self, row: int) -> None:
        """Run each expert of layer `row` on the tokens kept for it, natively and at each precision."""
        if not self.kept[row]:
            return
        x_TH = torch.cat([x for x, _ in self.kept[row]])
        ids_TK = torch.cat([i for _, i in self.kept[row]])
        self.kept[row], self.kept_bytes[row] = [], 0
        experts = self.hm.layers[row].experts
        for e, tok, _ in expert_groups(ids_TK, self.hm.num_experts):
            x = x_TH[tok]
            y = expert_output(experts, self.weights.of(row, e, "native"), x).double()
            self.tokens_LE[row, e] += len(tok)
            self.sq_ref_LE[row, e] += float((y * y).sum())
            for p in self.precisions:
                d = expert_output(experts, self.weights.of(row, e, p), x).double() - y
                self.sq_err_LE[p][row, e] += float((d * d).sum())

    def errors(self) -> dict[str, np.ndarray]:
        """Flush every layer; errors [L, E] per precision, nan where no token was routed. An
        output that is zero on every token (and so its quantised one) has error 0."""
        for row in range(len(self.kept)):
            self.flush(row)
        routed = self.tokens_LE > 0
        out = {}
        for p, sq in self.sq_err_LE.items():
            rel = np.divide(sq, self.sq_ref_LE, out=np.zeros_like(sq), where=self.sq_ref_LE > 0)
            out[p] = np.where(routed, np.sqrt(rel), np.nan)
        return out


class AtPrecision:
    """A layer's experts computed from its bank with every expert's weights at `precision`
    (quantised and dequantised per expert as it is computed): what the model would compute with
    its routed experts stored at that precision. Has the bank interface the adapter calls."""

    def __init__(self, weights: QuantisedWeights, row: int, precision: str):
        self.weights, self.row, self.precision = weights, row, precision

    def forward(self, experts, x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
        out_TH = torch.zeros_like(x_TH)
        w_flat = w_TK.reshape(-1)
        for e, tok, idx in expert_groups(ids_TK, experts.num_experts):
            w = self.weights.of(self.row, e, self.precision)
            y = expert_output(experts, w, x_TH[tok]) * w_flat[idx, None]
            out_TH.index_add_(0, tok, y.to(out_TH.dtype))
        return out_TH


def teacher_forced_inputs(tokenizer, texts: list[str], generated: list[list[int]], device) -> dict:
    """One batch teacher-forced: each prompt's text (left-padded, as generated) then its generated tokens
    that were fed back (all but the last), right-padded; `counted` [B, S] marks the positions whose
    next token the histogram counted a step for."""
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    fed = [g[:-1] for g in generated]
    G = max((len(f) for f in fed), default=0)
    gen_BG = torch.full((len(fed), G), int(tokenizer.pad_token_id), dtype=torch.long)
    am_BG = torch.zeros((len(fed), G), dtype=torch.long)
    for b, f in enumerate(fed):
        gen_BG[b, :len(f)] = torch.tensor(f, dtype=torch.long)
        am_BG[b, :len(f)] = 1
    ids_BS = torch.cat([enc["input_ids"], gen_BG], dim=1).to(device)
    am_BS = torch.cat([enc["attention_mask"], am_BG], dim=1).to(device)
    return {"input_ids": ids_BS, "attention_mask": am_BS, "position_ids": (am_BS.cumsum(-1) - 1).clamp(min=0),
            "counted": am_BS.bool()}


@torch.no_grad()
def _log_probs(weights: QuantisedWeights, precision: str, inputs: dict) -> torch.Tensor:
    """Next-token log-probabilities [N, V] (float32) at the counted positions, every routed expert
    at `precision`; nothing is counted."""
    hm = weights.hm
    install(hm.model, None, [AtPrecision(weights, i.row, precision) for i in hm.layers])
    try:
        args = {k: v for k, v in inputs.items() if k != "counted"}
        logits = hm.model(use_cache=False, **args).logits
    finally:
        install(hm.model, hm.counter, hm.banks)
    return torch.log_softmax(logits[inputs["counted"]].float(), dim=-1)


def model_agreement(weights: QuantisedWeights, tokenizer, texts: list[str], generated: list[list[int]],
                    batch_size: int, precisions: list[str], advance: Callable[[int], None] | None = None
                    ) -> dict[str, dict]:
    """{precision: {"agreement", "mean_kl", "tokens"}}: teacher-forced on every prompt's text and
    its fed back tokens, in batches of `batch_size`, each precision against native (both computed
    per expert by `AtPrecision`, so that only the weights differ). One precision after the other,
    native computed again for each: its experts are quantised once while they stay kept."""
    hm = weights.hm
    device = next(p for p in hm.model.parameters() if p.numel()).device
    out = {}
    for p in precisions:
        same, kl, tokens = 0, 0.0, 0
        for start in range(0, len(texts), batch_size):
            inputs = teacher_forced_inputs(tokenizer, texts[start:start + batch_size],
                                           generated[start:start + batch_size], device)
            native, at_p = _log_probs(weights, "native", inputs), _log_probs(weights, p, inputs)
            tokens += len(native)
            same += int((at_p.argmax(-1) == native.argmax(-1)).sum())
            kl += float((native.exp() * (native - at_p)).sum(-1).clamp(min=0).double().sum())
            if advance is not None and p == precisions[-1]:
                advance(len(inputs["input_ids"]))
        weights.forget(p)
        if tokens:  # no position to score: nothing to say
            out[p] = {"agreement": same / tokens, "mean_kl": kl / tokens, "tokens": tokens}
    return out


def measure_quality(hm: HFModel, tokenizer, generate: Callable[[], list[list[int]]], texts: list[str],
                    batch_size: int, advance: Callable[[int], None] | None = None
                    ) -> tuple[list[list[int]], MeasuredQuality]:
    """Run `generate` (the routing capture: it returns each prompt's generated ids) with the
    error hooks on, then the teacher-forced passes over `texts` (the prompts as generation
    tokenised them): (the generated ids, the measurement)."""
    precisions, skipped = measurable(hm)
    weights = QuantisedWeights(hm)
    with ExpertErrors(hm, precisions, weights) as meter:
        generated = generate()
    errors = meter.errors()
    counts_LE = hm.counter.counts_LE
    if precisions and not np.array_equal(meter.tokens_LE, counts_LE):
        raise RuntimeFailure("the quality measurement saw other routed tokens than the histogram counted")
    model = {}
    if precisions:
        model = model_agreement(weights, tokenizer, texts, generated, batch_size, precisions, advance)
    elif advance is not None:
        advance(len(texts))  # nothing to score: the pass is done
    if any(m["tokens"] != hm.counter.tokens for m in model.values()):
        raise RuntimeFailure(f"teacher-forced scoring saw {next(iter(model.values()))['tokens']} tokens, the "
                             f"histogram counted {hm.counter.tokens}")
    native = hm.banks[0].precision
    if native in MEASURED:  # stored as they are: no error, the same model, by definition
        errors[native] = np.where(counts_LE > 0, 0.0, np.nan)
        model[native] = {"agreement": 1.0, "mean_kl": 0.0, "tokens": hm.counter.tokens}
    return generated, MeasuredQuality(errors, model, native, skipped)
