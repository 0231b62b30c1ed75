"""A Hugging Face checkpoint expert-parallel (docs/runtime.md, "Checkpoints expert-parallel"): each
rank generates its share of the prompts with attention and KV cache of its own, its routed
experts reached through the synthetic runs' exchange (dispatch.py). Lockstep: every rank takes
part in every exchange of every step; a step begins with an all_reduce of "still generating",
and a rank whose prompts are done sends empty batches until no rank generates. Padding and
finished sequences are not sent.

Shape letters: T = tokens of a forward, K = top_k, H = hidden, A = assignments received,
L = MoE layers, E = experts, S = steps, R = ranks."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import stack_rank_traces

from ..hf.adapter import install
from ..hf.steps import CheckpointMoE
from .dispatch import ExpertParallel
from .summary import gather_to_rank0


class EPCheckpoint(ExpertParallel):
    """A loaded checkpoint (hf/steps.py `CheckpointMoE`, the loop's model) as one rank of an
    expert-parallel job: its layers' experts reach the exchange through the adapter's seam, its
    steps go in lockstep, and it counts what this rank receives (`ExpertParallel`)."""

    def __init__(self, model: CheckpointMoE, exchange, control=None):
        super().__init__(model, exchange)
        self.control = control
        L, E = model.counts_LE.shape
        self.step_LE = torch.zeros(L, E, dtype=torch.int64, device=model.info.device)  # received this step
        self.trace_steps: list[np.ndarray] = []  # per step: the routing this rank sent, int32 [L, T, K]
        self._sent: list[np.ndarray | None] = [None] * L
        # The adapter's seam computes each MoE layer through `.forward(experts, x, ids, w)`: here, the exchange.
        install(model.hm.model, model.hm.counter,
                [SimpleNamespace(forward=functools.partial(self.layer, row)) for row in range(L)])

    # ---- the exchange ----

    def layer(self, row: int, experts, x_TH, ids_TK, w_TK) -> torch.Tensor:
        if row == 0:
            self.begin_step(True, x_TH.shape[0])
        mask_T = self.hm.counter.token_mask_T  # padding and finished sequences are not sent
        if mask_T is not None:
            ids_TK = torch.where(mask_T.to(ids_TK.device)[:, None], ids_TK, -1)
        return self._exchange(row, experts, x_TH, ids_TK, w_TK)

    def begin_step(self, generating: bool, num_tokens: int) -> bool:
        """Collective, before a step's first exchange: whether any rank still generates (then
        the exchange's own step start, on every rank)."""
        flag = torch.tensor([int(generating)], dtype=torch.int64)
        dist.all_reduce(flag, group=self.control)
        if not int(flag):
            return False
        self.exchange.begin_step(num_tokens)
        return True

    def _exchange(self, row: int, experts, x_TH, ids_TK, w_TK) -> torch.Tensor:
        self._sent[row] = ids_TK.detach().to("cpu", torch.int32).numpy()
        compute = self.model.experts_L[row]
        return self.exchange_layer(row, x_TH, ids_TK, w_TK, self.step_LE[row],
                                   lambda x, ids, w: compute.forward(experts, x, ids, w))

    def empty_forward(self) -> None:
        """A done rank's forward (another rank generates): an empty batch through every MoE layer,
        computing what the others send here."""
        H, K = self.banks[0].hidden, self.hm.top_k
        dev, dtype = self.info.device, self.banks[0].compute_dtype
        for layer in self.hm.layers:
            self._exchange(layer.row, layer.experts, torch.empty(0, H, dtype=dtype, device=dev),
                           torch.empty(0, K, dtype=torch.int64, device=dev),
                           torch.empty(0, K, dtype=torch.float32, device=dev))

    def lockstep(self, forwards: Iterator) -> Iterator:
        """The job's steps on this rank, the same number on every rank (the module docstring's
        lockstep); the loop runs each through `step`."""
        yield from forwards
        while self.begin_step(False, 0):
            yield self.empty_forward

    # ---- one step of the loop ----

    def step(self, forward) -> None:
        self.model.step(forward, run=self._run)

    def _run(self, forward) -> torch.Tensor:
        """Run one of `lockstep`'s forwards; what this rank received (counted by the model against
        the hot sets it read)."""
        forward()
        step_LE = self.step_LE.cpu().clone()  # a CPU tensor's .cpu() is itself, zeroed below
        self.step_LE.zero_()
        self.end_step(step_LE)
        self.trace_steps.append(np.stack(self._sent))  # every layer exchanged this step
        self._sent = [None] * len(self._sent)
        return step_LE


class Lockstep:
    """A rank's `Generation` as the EP loop's routing source: its forwards, then empty ones until all ranks' end."""

    def __init__(self, generation, ep: EPCheckpoint):
        self.generation, self.ep = generation, ep
        self.name, self.tokens_per_step = generation.name, generation.tokens_per_step

    def steps(self) -> Iterator:
        return self.ep.lockstep(self.generation.forwards())

    def texts(self) -> list[str]:
        return self.generation.texts()


def job_trace(trace_steps: list[np.ndarray], control=None) -> np.ndarray | None:
    """Collective: the job's routing as a trace on rank 0 (None elsewhere), int32 [S, L, R x T_max, K]."""
    ranks = gather_to_rank0(trace_steps, control)
    return None if ranks is None else stack_rank_traces(ranks)
