"""Device check of run --prefetch trace: outputs equal prefetch off (graph and no graph), counters
equal simulate's, on the tiny recipe with a synthetic trace. argv: an empty folder for its files."""
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hotsplit_runtime.from_recipe import prepare_run

from hotsplit_cli.analysis.simulate import SimRequest, run_simulation
from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.traffic.hist import Histogram, save_hist
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace

out = Path(sys.argv[1])
r = load_recipe("tiny")
m = r.model
tr = synthetic_trace(zipf_shares(4, 32, 1.2, 5), m.moe_layer_ids, 48, 16, 4, drift_every=16, seed=4)
trace = save_trace(out / "t.npz", tr)
hist = out / "h.json"
save_hist(hist, Histogram("tiny", "t", 4, 48 * 16, tuple(m.moe_layer_ids), tr.counts_LE(32)))
base = {"HOTSPLIT_DYN_STEPS": "8", "HOTSPLIT_DYN_MAX_SWAPS": "2", "HOTSPLIT_DYN_MARGIN": "1.0",
        "HOTSPLIT_HOT_GIB": "0.0035"}
failures = []  # the script exits 1 when any check fails
KEYS = ("prefetched", "useful", "wasted", "staged_hits", "copies", "cold_reads", "hit_rate", "pcie_bytes_per_step")


def outputs(env, graph):
    k = resolve_knobs(r.knobs, {**base, **env})
    p = prepare_run(r, k, trace_path=trace)
    e = p.engine
    if not graph:
        e.use_graph = False
    outs = []
    t0 = time.perf_counter()
    for routed in e.source.steps():
        e.step(routed)
        outs.append(e.out_TH.clone())
        if e.step_count % k.dyn_steps == 0:
            e.close_window(update=e.step_count < 48)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    e.book.landed(e.model.publish_ready(wait=True)[1])
    return outs, e, dt, k


print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", torch.__version__)
for graph in (True, False):
    off, e_off, t_off, _ = outputs({"HOTSPLIT_PREFETCH": "off"}, graph)
    on, e_on, t_on, k = outputs({"HOTSPLIT_PREFETCH": "trace", "HOTSPLIT_PREFETCH_POOL": "layer",
                                 "HOTSPLIT_PREFETCH_SLOTS": "2"}, graph)
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(on, off, strict=True))
    print(f"graph={e_on.use_graph} compute={type(e_on.model.compute).__name__} steps={len(on)} "
          f"max|on-off|={diff} equal={all(torch.equal(a, b) for a, b in zip(on, off, strict=True))} "
          f"ms/step off {1e3 * t_off / len(off):.2f} on {1e3 * t_on / len(on):.2f}")
    left = [b.staged for b in e_on.model.banks if b.staged]
    maps = all(np.array_equal(b.expert2slot_E.cpu().numpy(), b.table.expert2slot_E) for b in e_on.model.banks)
    print("  nothing left staged:", not left, " device maps = slot tables:", maps)
    if left or not maps or not all(torch.equal(a, b) for a, b in zip(on, off, strict=True)):
        failures.append(f"graph={e_on.use_graph}: prefetch changed outputs or left state behind")
for pool, slots in (("layer", 2), ("shared", 3)):
    k = resolve_knobs(r.knobs, {**base, "HOTSPLIT_PREFETCH": "trace", "HOTSPLIT_PREFETCH_POOL": pool,
                                "HOTSPLIT_PREFETCH_SLOTS": str(slots)})
    sim = run_simulation(SimRequest(trace, ("dynamic",), fit_path=hist), r, k).staging.rows["dynamic"]
    p = prepare_run(r, k, trace_path=trace)
    s = p.engine.run(p.steps)
    same = {key: (s.prefetch[key], sim[key]) for key in KEYS if s.prefetch[key] != sim[key]}
    print(f"pool={pool} slots={slots} graph={p.engine.use_graph}: runtime = simulate: {not same} {same or ''} "
          f"prefetched={sim['prefetched']} useful={sim['useful']} swaps={s.swaps}")
    if same:
        failures.append(f"pool={pool}: runtime counters differ from simulate's: {same}")
print("ok" if not failures else "FAILED: " + "; ".join(failures))
sys.exit(1 if failures else 0)
