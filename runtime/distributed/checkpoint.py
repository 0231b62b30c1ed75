"""A Hugging Face checkpoint expert-parallel (docs/runtime.md, "Checkpoints expert-parallel"):
attention, dense layers and the KV cache per rank (each rank generates its share of the
prompts), routed experts reached through the synthetic runs' exchange (dispatch.py).

Lockstep: every rank takes part in every exchange of every step. A step begins with an
all_reduce of "still generating" (in the first MoE layer of a rank's forward, or before the
`empty_forward` of a rank whose prompts are done); a done rank sends empty batches through
every MoE layer until no rank generates. Padding and finished sequences are not sent.

Shape letters: T = tokens of a forward, K = top_k, H = hidden, A = assignments received,
L = MoE layers, E = experts, S = steps, R = ranks."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import stack_rank_traces

from ..hf.adapter import install
from ..hf.steps import CheckpointMoE
from .dispatch import ExpertParallel
from .summary import gather_to_rank0


class _EPLayer:
    """One MoE layer's experts on an expert-parallel rank: the adapter's seam (`.forward`)."""

    def __init__(self, row: int, ep: EPCheckpoint):
        self.row, self.ep = row, ep

    def forward(self, experts: torch.nn.Module, x_TH: torch.Tensor, ids_TK: torch.Tensor,
                w_TK: torch.Tensor) -> torch.Tensor:
        return self.ep.layer(self.row, experts, x_TH, ids_TK, w_TK)


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
        install(model.hm.model, model.hm.counter, [_EPLayer(row, self) for row in range(L)])

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
    """A rank's `Generation` (capture.py) as the routing source of the one loop in an EP job: its
    forwards, then empty ones until every rank's prompts are done (`EPCheckpoint.lockstep`)."""

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
