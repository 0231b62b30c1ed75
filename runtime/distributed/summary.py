"""The job's figures, gathered to rank 0: one record per window and one summary for the run.

Each rank's window record (runtime/windows.py) and its loads go to rank 0 with
all_gather_single on the control group (fixed-size float64 vectors: uneven list gathers do
not work on gloo). Rank 0 makes:
- per window a `JobRecord`: the job's hit rate (all hits / all assignments), swaps and copies
  summed, the window's balancedness (sum over its (step, layer) exchanges of the mean rank load
  / sum of the max, vLLM's form), and each rank's load, hit rate and cold reads;
- for the run the job's `RunSummary` and the EP figures: ranks (each with its load, hit rate,
  cold reads and cold paths), balancedness, the bottleneck rank and how far it leads, and the
  exchange measured (job.py adds the ledger's prediction for the run's exchange mode: the
  recipe's formula at the allocated hidden size and activation bytes, this run's tokens per
  rank).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from hotsplit_cli.placement.dispatch import balancedness

from ..log import HitRateRecord
from ..windows import RunSummary


def gather_rows(values, group) -> np.ndarray:
    """float64 [R, n]: every rank's `values` (the same length on every rank)."""
    mine = torch.as_tensor(np.asarray(values, dtype=np.float64).ravel())
    out = torch.empty(dist.get_world_size() * mine.numel(), dtype=torch.float64)
    dist.all_gather_single(out, mine, group=group)
    return out.view(dist.get_world_size(), -1).numpy()


@dataclass(frozen=True)
class JobRecord(HitRateRecord):
    """A window of the whole job; `ranks` gives each rank's part."""

    balancedness: float = 1.0
    ranks: list[dict] = field(default_factory=list)


def _record_row(rec: HitRateRecord, hits_L, assigned_L, cold_reads: int) -> list[float]:
    return [rec.step, rec.swaps, rec.swaps_total, rec.bytes_copied, rec.copy_ms, rec.cold_bytes_per_step,
            float(np.sum(hits_L)), float(np.sum(assigned_L)), float(cold_reads), *hits_L, *assigned_L]


def job_record(rec: HitRateRecord, counters: dict, loads_WL: np.ndarray, totals: np.ndarray, group) -> JobRecord | None:
    """Collective: every rank's window to rank 0 (None elsewhere). `counters`: the window's
    hits_L, assigned_L and cold_reads of this rank; `totals`: its [hits, assigned] since the start."""
    L = len(counters["hits_L"])
    row = _record_row(rec, counters["hits_L"], counters["assigned_L"], counters["cold_reads"]) + list(totals)
    rows = gather_rows(row, group)
    loads = gather_rows(loads_WL.ravel(), group)  # [R, W*L]
    if dist.get_rank() != 0:
        return None
    hits_RL, assigned_RL = rows[:, 9:9 + L], rows[:, 9 + L:9 + 2 * L]
    hits, assigned = rows[:, 6].sum(), rows[:, 7].sum()
    tot_hits, tot_assigned = rows[:, -2].sum(), rows[:, -1].sum()
    layer = np.divide(hits_RL.sum(0), assigned_RL.sum(0), out=np.zeros(L), where=assigned_RL.sum(0) > 0)
    ranks = [{"rank": r, "tokens": int(rows[r, 7]), "hit_rate": float(rows[r, 6] / rows[r, 7]) if rows[r, 7] else 0.0,
              "cold_reads": int(rows[r, 8])} for r in range(len(rows))]
    return JobRecord(
        step=int(rows[0, 0]), hit_rate_window=float(hits / assigned) if assigned else 0.0,
        hit_rate_total=float(tot_hits / tot_assigned) if tot_assigned else 0.0,
        swaps=int(rows[:, 1].sum()), swaps_total=int(rows[:, 2].sum()), bytes_copied=int(rows[:, 3].sum()),
        copy_ms=float(rows[:, 4].max()), cold_bytes_per_step=float(rows[:, 5].sum()),
        layer_hit_rate=[float(x) for x in layer], planner_error=rec.planner_error,
        balancedness=balancedness(loads.T),  # one row per (step, layer) exchange
        ranks=ranks)


def format_job_line(r: JobRecord) -> str:
    from ..log import format_line

    return f"{format_line(r)}  balance {r.balancedness:.3f}"


@dataclass
class EPFigures:
    """The EP part of the job's summary (rank 0)."""

    ranks: list[dict]
    balancedness: float
    predicted_balancedness: float | None
    bottleneck: dict
    exchange: dict
    placement: dict
    rebalances: list[dict] = field(default_factory=list)

    def to_doc(self) -> dict:
        return dataclasses.asdict(self)


# A rank's cold paths (runtime/cold_split.py `report`) as numbers, for the gather: scalars, then per path.
_COLD_SCALARS = ("cpu_share", "layers", "layers_with_cpu")
_COLD_PATH_FIELDS = ("experts", "bytes", "allocated_bytes", "ms", "predicted_ms")


def _cold_row(paths: dict | None) -> list[float]:
    if paths is None:
        return [0.0] * (1 + len(_COLD_SCALARS) + 2 * len(_COLD_PATH_FIELDS))
    return [1.0, *(float(paths[k]) for k in _COLD_SCALARS),
            *(float(paths[p][k]) for p in ("gpu", "cpu") for k in _COLD_PATH_FIELDS)]


def _cold_doc(row: np.ndarray, mode: str) -> dict | None:
    """One rank's cold paths, the fields of a single-rank summary's `cold_paths` (None: gpu path)."""
    if row[0] == 0:
        return None
    n, f = len(_COLD_SCALARS), len(_COLD_PATH_FIELDS)
    doc: dict = {"mode": mode, **{k: float(v) for k, v in zip(_COLD_SCALARS, row[1:1 + n], strict=True)}}
    doc["layers"], doc["layers_with_cpu"] = int(doc["layers"]), int(doc["layers_with_cpu"])
    for i, path in enumerate(("gpu", "cpu")):
        vals = row[1 + n + i * f:1 + n + (i + 1) * f]
        doc[path] = {k: (float(v) if k.endswith("ms") else int(v))
                     for k, v in zip(_COLD_PATH_FIELDS, vals, strict=True)}
    return doc


def job_summary(run, stats, expected_rank: float | None, cold_reads: int, group) -> tuple[RunSummary, EPFigures] | None:
    """Collective: the job's summary and EP figures on rank 0 (None elsewhere). `run`: this
    rank's RankRun; `stats`: its ExchangeStats. Each rank's entry carries its cold paths (where
    its cold work went: cold_path cpu / split), as a single rank's summary does."""
    s = run.summary
    cold = _cold_row(s.cold_paths)
    row = [s.steps, s.tokens, s.elapsed_s, s.swaps, s.bytes_copied, s.copy_ms, s.cold_bytes_per_step,
           s.hit_rate, float(run.loads_SL.sum()), float(cold_reads), -1.0 if expected_rank is None else expected_rank,
           float(stats.act_bytes), float(stats.meta_bytes), stats.ms, float(stats.exchanges), *cold,
           *s.layer_hit_rate]
    rows = gather_rows(row, group)
    loads = gather_rows(run.loads_SL.ravel(), group)  # [R, S*L]
    if dist.get_rank() != 0:
        return None
    R, L = len(rows), len(s.layer_hit_rate)
    received = rows[:, 8]
    hits = rows[:, 7] * received
    c0 = 15 + len(cold)
    mode = s.cold_paths["mode"] if s.cold_paths else "gpu"  # the knob: the same on every rank
    layer_RL = rows[:, c0:c0 + L]
    loads_SLR = loads.T.reshape(-1, L, R)
    job = RunSummary(
        steps=int(rows[0, 0]), tokens=int(rows[:, 1].sum()), elapsed_s=float(rows[:, 2].max()),
        tokens_per_s=float(rows[:, 1].sum() / rows[:, 2].max()) if rows[:, 2].max() > 0 else 0.0,
        hit_rate=float(hits.sum() / received.sum()) if received.sum() else 0.0,
        hit_rate_last_window=None, expected_hit_rate=s.expected_hit_rate, swaps=int(rows[:, 3].sum()),
        bytes_copied=int(rows[:, 4].sum()), copy_ms=float(rows[:, 5].max()),
        cold_bytes_per_step=float(rows[:, 6].sum()),
        layer_hit_rate=[float(x) for x in (layer_RL * loads_SLR.sum(0).T).sum(0)
                        / np.maximum(loads_SLR.sum(axis=(0, 2)), 1)],
        interrupted=s.interrupted)  # Ctrl-C stops every rank at the same window
    ranks = [{"rank": r, "tokens": int(received[r]), "hit_rate": float(rows[r, 7]),
              "expected_hit_rate": None if rows[r, 10] < 0 else float(rows[r, 10]), "cold_reads": int(rows[r, 9]),
              "swaps": int(rows[r, 3]), "cold_paths": _cold_doc(rows[r, 15:c0], mode)} for r in range(R)]
    mean = received.mean()
    top = int(np.argmax(received))
    exchanges = rows[:, 14].sum()
    measured = float(rows[:, 11].sum() / exchanges) if exchanges else 0.0
    figures = EPFigures(
        ranks=ranks, balancedness=balancedness(loads_SLR.reshape(-1, R)), predicted_balancedness=None,
        bottleneck={"rank": top, "load": int(received[top]), "lead": float(received[top] / mean) if mean else 1.0},
        exchange={"measured_bytes_per_layer": measured,
                  "ms_per_layer": float(rows[:, 13].sum() / exchanges) if exchanges else 0.0,
                  "meta_bytes_per_layer": float(rows[:, 12].sum() / exchanges) if exchanges else 0.0,
                  "exchanges_per_rank": int(rows[0, 14])},
        placement={})
    return job, figures
