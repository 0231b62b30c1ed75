"""Plug hotsplit into a transformers 5 MoE model through its experts interface: every experts
module calls the registered `"hotsplit"` function with `(self, hidden_states [T, H],
top_k_index [T, K], top_k_weights [T, K])`, which counts routed assignments per (MoE layer,
expert) for the tokens marked real and computes the experts from the layer's bank.
transformers keeps attention, the KV cache, routers and generation.

Shape letters: T = tokens of a forward pass, K = top_k, E = experts, L = MoE layers, S = steps."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from ..moe import expert_counts

IMPL_NAME = "hotsplit"
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class MoELayerInfo:
    row: int  # index into the counters / hist rows
    layer_id: int  # model layer index
    experts: torch.nn.Module
    router: torch.nn.Module | None
    num_experts: int
    top_k: int


def find_moe_layers(model: torch.nn.Module) -> list[MoELayerInfo]:
    """Every experts module transformers dispatches through the experts interface, in layer order;
    dense layers have none, so the MoE layer ids are exactly the model's (maybe non-contiguous)."""
    found = []
    modules = dict(model.named_modules())
    for name, mod in modules.items():
        if not hasattr(mod, "is_concatenated") or not hasattr(mod, "num_experts"):
            continue  # not decorated by use_experts_implementation
        m = _LAYER_RE.search(name)
        if m is None:
            continue
        parent = modules.get(name.rsplit(".", 1)[0])
        router = next((r for r in (getattr(parent, a, None) for a in ("gate", "router"))
                       if isinstance(r, torch.nn.Module) and hasattr(r, "top_k")), None)
        top_k = int(getattr(router, "top_k", 0) or getattr(model.config, "num_experts_per_tok", 0))
        found.append((int(m.group(1)), mod, router, top_k))
    found.sort(key=lambda t: t[0])
    return [MoELayerInfo(i, lid, mod, router, int(mod.num_experts), k) for i, (lid, mod, router, k) in enumerate(found)]


@dataclass
class RoutingCounter:
    """Exact routed-assignment counts [L, E], per step, with an optional trace; `token_mask_T` (bool,
    set by the driver before each forward, in the experts' token order) marks the tokens counted."""

    num_layers: int
    num_experts: int
    keep_trace: bool = False
    token_mask_T: torch.Tensor | None = None
    counts_LE: np.ndarray = field(init=False)
    step_LE: torch.Tensor | None = field(init=False, default=None)
    steps_SLE: list[np.ndarray] = field(init=False, default_factory=list)
    trace_steps: list[np.ndarray] = field(init=False, default_factory=list)  # [L, T, K] per step
    tokens: int = field(init=False, default=0)
    _ids: list[torch.Tensor | None] = field(init=False, default_factory=list)
    _tokens_dev: torch.Tensor | None = field(init=False, default=None)  # this step's tokens, on the device

    def __post_init__(self):
        self.counts_LE = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        self.begin_step(self.token_mask_T)

    def begin_step(self, token_mask_T: torch.Tensor | None) -> None:
        self.token_mask_T = token_mask_T
        self.step_LE = None
        self._ids = [None] * self.num_layers

    def record(self, row: int, ids_TK: torch.Tensor) -> None:
        """Count one layer's routing of this step on its device, without a host synchronisation
        (the step's counts are read once, in `end_step`)."""
        if self.step_LE is None:
            self.step_LE = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int64, device=ids_TK.device)
            self._tokens_dev = torch.zeros((), dtype=torch.int64, device=ids_TK.device)
        ids = ids_TK
        if self.token_mask_T is not None:
            if self.token_mask_T.device != ids.device:  # moved once per step, not once per layer
                self.token_mask_T = self.token_mask_T.to(ids.device)
            mask = self.token_mask_T
            if mask.numel() != ids.shape[0]:
                raise RuntimeError(f"token mask has {mask.numel()} entries but the layer saw {ids.shape[0]} tokens")
            ids = torch.where(mask[:, None], ids, -1)
        if row == 0:  # every token passes every MoE layer once: count tokens at the first
            self._tokens_dev += (ids[:, 0] >= 0).sum()
        self.step_LE[row] += expert_counts(ids, self.num_experts)
        if self.keep_trace:
            self._ids[row] = ids.detach().to("cpu", torch.int32)

    def end_step(self) -> np.ndarray:
        """Close the step; returns its counts [L, E] (int64)."""
        if self.step_LE is None:
            step = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        else:
            step = self.step_LE.cpu().numpy()
            self.tokens += int(self._tokens_dev)
        self.counts_LE += step
        self.steps_SLE.append(step)
        if self.keep_trace:
            ids = [x for x in self._ids if x is not None]
            if ids:
                self.trace_steps.append(np.stack([x.numpy() for x in ids]))
        self.step_LE = None
        return step


@dataclass
class LayerState:
    """What the experts function needs for one module (attached as `module._hotsplit`)."""

    row: int
    counter: RoutingCounter | None
    bank: object  # HFExpertBank (or any object with .forward(experts, x, ids, w))


def hotsplit_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    state: LayerState | None = getattr(self, "_hotsplit", None)
    if state is None:
        raise RuntimeError(f"{type(self).__name__} runs with experts_implementation='{IMPL_NAME}' but was "
                           "not installed by hotsplit (call runtime.hf.install)")
    if state.counter is not None:
        state.counter.record(state.row, top_k_index)
    return state.bank.forward(self, hidden_states, top_k_index, top_k_weights)


def install(model: torch.nn.Module, counter: RoutingCounter | None, banks: list) -> None:
    """Attach the counter (None: nothing counted) and each MoE layer's bank (`banks[row]`), and
    switch the model to the hotsplit experts."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(IMPL_NAME, hotsplit_experts_forward)  # idempotent
    layers = find_moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__}: no experts module dispatched through transformers' "
                         "experts interface (is this a supported MoE model?)")
    for info in layers:
        info.experts._hotsplit = LayerState(info.row, counter, banks[info.row])
    model.set_experts_implementation(IMPL_NAME)
