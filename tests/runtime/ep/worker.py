"""One rank of the EP correctness tests (run under torchrun by tests/runtime/ep/harness.py):
runs the recipe through the real EP path and saves, per step, this rank's input hidden states,
routing and outputs, so the test compares them with the single-process reference.

argv: recipe.yaml out_dir [placement.json]
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
from hotsplit_runtime import cold_split
from hotsplit_runtime.api import RunRequest, Watch
from hotsplit_runtime.distributed.job import run_in_group
from hotsplit_runtime.engine import Engine

from hotsplit_cli.config.knobs import resolve_knobs
from hotsplit_cli.config.recipe import load_recipe
from hotsplit_cli.hotset.coldpath import ColdRates
from hotsplit_cli.hotset.planner import Swap
from hotsplit_cli.hotset.windows import WindowBook
from hotsplit_cli.placement.file import load_placement
from tests.runtime.ep.harness import assert_group_gone

captured = []
_step = Engine.step


def _shared_bank_memory() -> dict:
    """This rank's view of the shared cold bank files (from /proc/self/smaps): bytes mapped,
    resident (Rss), its proportional share (Pss) and its private bytes."""
    got = {"size": 0, "rss": 0, "pss": 0, "private": 0, "mappings": 0, "files": []}
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5].startswith("/dev/shm/hotsplit-")
                got["mappings"] += inside
                if inside:
                    got["files"].append(head[5])
            elif inside and head[0] in ("Size:", "Rss:", "Pss:", "Private_Clean:", "Private_Dirty:"):
                key = {"Size:": "size", "Rss:": "rss", "Pss:": "pss"}.get(head[0], "private")
                got[key] += int(head[1]) * 1024
    return got


def _capture(self, routed):
    if not captured and os.environ.get("EP_TEST_MEMORY"):
        import torch.distributed as dist

        for bank in self.model.banks:
            float(bank.cold_EB.float().sum())  # every rank reads the whole bank: its pages come in
        dist.barrier()
        (Path(sys.argv[2]) / f"mem{os.environ['RANK']}.json").write_text(json.dumps(_shared_bank_memory()))
        dist.barrier()
    _step(self, routed)
    x = _host(self.x_TH)  # this step's input: drawn at the start of the step
    ids, w = routed
    captured.append((x, _host(ids), None if w is None else _host(w), _host(self.out_TH), self.model.hot_LE().copy()))


def _host(a) -> np.ndarray:
    """A copy in host memory; 16-bit floats (a GPU run's bfloat16, which numpy lacks) as float32."""
    if not hasattr(a, "detach"):
        return np.asarray(a)
    a = a.detach().cpu()
    return (a.float() if a.is_floating_point() else a).numpy().copy()


def _fixed_rates(bank, info):
    """Equal device and CPU rates (the split halves the cold experts): measuring them would take
    each rank tens of seconds on a loaded test machine, and the outputs do not depend on them."""
    return ColdRates(10.0, ((1, 10.0), (16, 10.0))), "fixed test rates"


def _rotate(self, counts_LE, hot_LE, step):
    """Swaps at every window whatever the counts (the swap rule has its own tests): in each
    layer the first hot expert makes room for the first cold one this rank received."""
    swaps = []
    for li in range(hot_LE.shape[0]):
        hot, cold = np.flatnonzero(hot_LE[li]), np.flatnonzero(~hot_LE[li] & (counts_LE[li] > 0))
        if len(hot) and len(cold):
            h, c = int(hot[0]), int(cold[0])
            swaps.append(Swap(li, h, c, float(counts_LE[li, c]), float(counts_LE[li, h])))
    return swaps, None


def main() -> None:
    cold_split.measure_rates = _fixed_rates
    WindowBook.decide = _rotate
    recipe_path, out = sys.argv[1], Path(sys.argv[2])
    placement = load_placement(sys.argv[3]) if len(sys.argv) > 3 else None
    rec = load_recipe(recipe_path)
    Engine.step = _capture
    result = run_in_group(RunRequest(rec, resolve_knobs(rec.knobs)), Watch(), placement=placement)
    assert_group_gone()
    rank = int(os.environ["RANK"])
    np.savez(out / f"rank{rank}.npz", x=np.stack([c[0] for c in captured]), ids=np.stack([c[1] for c in captured]),
             out=np.stack([c[3] for c in captured]), hot=np.stack([c[4] for c in captured]))
    if result is not None:
        doc = {"summary": result.summary.to_doc(), "figures": result.figures.to_doc(),
               "records": [r.to_doc() for r in result.summary.records]}
        (out / "job.json").write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
