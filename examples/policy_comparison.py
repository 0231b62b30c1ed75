"""Walk-through: compare static / dynamic / LRU / LFU / oracle on a drifting synthetic trace.

Writes a trace for the shipped `tiny` recipe (Zipf 1.1 traffic whose hotspot moves every 150
steps), then runs `hotsplit simulate` on it and draws the per-window hit rates.
Run: .venv/bin/python examples/policy_comparison.py [OUT_DIR]  (default: a temp folder)
"""

import sys
import tempfile
from pathlib import Path

from hotsplit_cli.cli import main
from hotsplit_cli.traffic.synthetic import synthetic_trace, zipf_shares
from hotsplit_cli.traffic.trace import save_trace

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "hotsplit-policy-lab")
out.mkdir(parents=True, exist_ok=True)
trace = synthetic_trace(zipf_shares(4, 32, 1.1, seed=0), layers=(1, 2, 3, 4), steps=600, batch=16, top_k=4,
                        drift_every=150, seed=0)
save_trace(out / "drift.npz", trace)
sys.exit(main(["simulate", "--trace", str(out / "drift.npz"), "--recipe", "tiny", "--plot",
               str(out / "policies.png")]))
