"""`prefetch trace` on a checkpoint: the co-activation table fitted on a routing trace of the same
model (`--prefetch-fit`) stages, as soon as MoE layer i's router has chosen, the experts of MoE
layer i + 1 that each counted token's experts at layer i predict, by the per-layer code the
staging replay and a synthetic trace run stage with (`analysis/prefetch.stage_layer`): the staging
copies then overlap layer i's experts and layer i + 1's attention. Slots, publication and counters
are every stager's (runtime/prefetch.py `StepStager`).

A forward hook on each router reads its choice on the host: one synchronisation per layer.
Shape letters: T = tokens of a forward pass, K = top_k, L = MoE layers, E = experts.
"""

from __future__ import annotations

import numpy as np

from hotsplit_cli.analysis.prefetch import stage_layer
from hotsplit_cli.traffic.predict import NextLayerPredictor

from ..prefetch import StagingPool, StepStager
from .loader import HFModel


class TraceStepStager(StepStager):
    """Stages layer i + 1 from layer i's routing of the same forward, hooked on `hm`'s routers."""

    def __init__(self, hm: HFModel, pool: StagingPool, predictor: NextLayerPredictor, fit_source: str):
        super().__init__(pool, predictor, fit_source, hm.num_experts, pool.expert_bytes)
        self.hm = hm
        self._member_TLE: np.ndarray | None = None  # this forward's memberships, filled layer by layer
        for row, layer in enumerate(hm.layers[:-1]):
            if layer.router is None:
                raise ValueError(f"MoE layer {layer.layer_id}: no router to stage the next layer from")
            layer.router.register_forward_hook(self._hook(row))  # for the model's life

    def _hook(self, row: int):
        def hook(module, args, output):
            ids_TK = output[2].reshape(-1, output[2].shape[-1]).cpu().numpy()  # the layer's choice, on the host
            T, (L, E) = len(ids_TK), self.staged_LE.shape
            if row == 0 or self._member_TLE is None or len(self._member_TLE) != T:
                self._member_TLE = np.zeros((T, L, E), dtype=bool)
            mask = self.hm.counter.token_mask_T  # the counted tokens (None: all)
            live_T = np.ones(T, dtype=bool) if mask is None else mask.cpu().numpy().astype(bool)
            self._member_TLE[np.arange(T)[:, None], row, ids_TK] = live_T[:, None]
            chosen = stage_layer(self._member_TLE, row + 1, live_T, self.hm.banks[row + 1].served_hot_E,
                                 self.staged_LE[row], self.predictor, self.pool.config)
            self.stage_row(row + 1, self.hm.banks[row + 1], chosen)
        return hook
