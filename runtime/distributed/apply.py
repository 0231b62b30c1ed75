"""Expert parallelism, applied to a rank's built model: one function for both model sources.

The built model (a synthetic `HotColdMoE`, or a checkpoint's `CheckpointMoE`) is wrapped, not
copied: it keeps its banks and counters, and its routed experts go through the exchange the
rank's placement routes with (dispatch.py `ExpertParallel`); a checkpoint's generation steps in
lockstep with the other ranks (checkpoint.py).
"""

from __future__ import annotations

from ..hf.steps import CheckpointMoE
from ..ranks import Rank
from .checkpoint import EPCheckpoint, Lockstep
from .dispatch import EXCHANGES, ExpertParallel


def expert_parallel(model, source, rank: Rank):
    """(the expert-parallel model, its routing source) of `rank`, from its one-rank model and source."""
    exchange = EXCHANGES[rank.exchange_mode](rank.replicas, rank.rank, rank.world, control=rank.group.control)
    if isinstance(model, CheckpointMoE):
        ep = EPCheckpoint(model, exchange, rank.group.control)
        return ep, Lockstep(source, ep)
    return ExpertParallel(model, exchange), source
