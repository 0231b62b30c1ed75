"""The CPU cold path's rate at each stored precision, side by side with plain torch on the same
weights: one MoE layer with every expert cold, DeepSeek-V2-Lite and Qwen3-30B-A3B expert shapes in
bf16, batch 1 / 16 / 64, `--threads` torch threads.

    python benchmarks/bench_cpu_cold_rate.py [--threads 2] [--rounds 5] [--json]
    python benchmarks/bench_cpu_cold_rate.py --scale 0.05 --rounds 2        # a quick check

Contenders, each in its own process (the others stopped with SIGSTOP while one is timed):
`path`, the runtime's CPU cold path as `ColdSplit` calls it (runtime/cold_split.py, mode cpu) at
each stored precision; plain torch on the native weights, `loop` (one F.linear pair per expert)
and `grouped_mm` (`torch._grouped_mm`, benchmarks/fullsize.py); and `probe`, the cost model's
time for the same routing from the probe's CPU expert rate (probes/cpu_expert.py) measured in its
process. Rounds take turns at who goes first; figures are medians over rounds. GB/s counts the
stored bytes of the distinct experts a call reads.

Targets: at native precision the path within 1.1x of the faster plain torch at every batch, and
the probe's predicted time within 10% of the path's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reporting import load_average, load_span  # noqa: E402

BATCHES = (1, 16, 64)
PLAIN = ("loop", "grouped_mm")
ROUTINGS = 4  # calls cycle through this many routings, so no call reads the experts the last one did


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    inter: int
    num_experts: int
    top_k: int


SHAPES = {
    # deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, moe_intermediate_size 1408,
    # n_routed_experts 64, num_experts_per_tok 6.
    "deepseek-v2-lite": Shape("DeepSeek-V2-Lite", 2048, 1408, 64, 6),
    # Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, moe_intermediate_size 768, num_experts 128,
    # num_experts_per_tok 8.
    "qwen3-30b-a3b": Shape("Qwen3-30B-A3B", 2048, 768, 128, 8),
}


def contenders(precisions: list[str]) -> list[str]:
    """`path:P` per stored precision, then plain torch and the probe."""
    return [f"path:{p}" for p in precisions] + list(PLAIN) + ["probe"]


class Child:
    """One contender's process: built once, then asked for timings line by line; stopped between."""

    def __init__(self, contender: str, args: argparse.Namespace, model: str):
        cmd = [sys.executable, __file__, "--child", contender, "--models", model, "--threads", str(args.threads),
               "--scale", str(args.scale), "--batches", ",".join(map(str, args.batches))]
        self.name = contender
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()  # {"stored_bytes": ...} or {"error": ...}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": f"exited with {self.proc.wait()}"}

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def pause(self, stop: bool) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)

    def close(self) -> None:
        self.pause(False)
        self.proc.kill()
        self.proc.wait()


def timed_alone(children: list, child, request: dict) -> dict:
    """`child`'s answer to `request` with every other contender stopped."""
    for c in children:
        c.pause(c is not child)
    try:
        return child.ask(request)
    finally:
        child.pause(True)


def measure(children: list, batches: list[int], rounds: int) -> dict[str, dict[int, list[float]]]:
    """Per contender and batch, one ms per round (the median of the call's samples); the probe
    answers all batches at once. Round r starts with contender r (a load change hits all alike)."""
    ms: dict[str, dict[int, list[float]]] = {c.name: {b: [] for b in batches} for c in children}
    live = [c for c in children if "error" not in c.ready]
    for r in range(rounds):
        for c in live[r % len(live):] + live[:r % len(live)] if live else []:
            if "error" in c.ready:
                continue
            answer = timed_alone(children, c, {"batches": batches})
            if "error" in answer:
                c.ready = answer
                continue
            for b in batches:
                ms[c.name][b].append(answer["ms"][str(b)])
    return ms


def rows_of(shape: Shape, children: list, ms: dict, batches: list[int]) -> list[dict]:
    """Per batch and contender: median ms, tokens/s, GB/s of stored bytes; the path's ratios to
    the faster plain torch and to the probe's prediction at the same precision's native row."""
    rows = []
    for b in batches:
        row: dict = {"model": shape.name, "batch": b}
        for c in children:
            if "error" in c.ready:
                row[c.name] = {"error": c.ready["error"]}
                continue
            times = ms[c.name][b]
            med = statistics.median(times)
            read = c.ready["read_bytes"][str(b)]
            row[c.name] = {"ms": med, "ms_rounds": times, "tokens_per_s": b / med * 1e3, "gbps": read / med / 1e6}
        plain = [row[p]["ms"] for p in PLAIN if "ms" in row.get(p, {})]
        native = row.get("path:native", {})
        if plain and "ms" in native:
            row["path_vs_torch"] = native["ms"] / min(plain)
            row["round_path_vs_torch"] = per_round(native, [row[p] for p in PLAIN if "ms" in row.get(p, {})])
        if "ms" in row.get("probe", {}) and "ms" in native:
            row["path_vs_probe"] = native["ms"] / row["probe"]["ms"]
            row["round_path_vs_probe"] = per_round(native, [row["probe"]])
        rows.append(row)
    return rows


def per_round(cell: dict, others: list[dict]) -> dict:
    """`cell`'s time over the fastest of `others` within each round (the same minutes of a
    shared machine's load), and the median and range of those ratios."""
    ratios = [t / min(o["ms_rounds"][r] for o in others) for r, t in enumerate(cell["ms_rounds"])]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": ratios}


def render(doc: dict) -> list[str]:
    """The markdown table of a run."""
    lines = [f"{doc['threads']} threads, scale {doc['scale']:g}, {doc['rounds']} rounds (medians); "
             f"{doc['load']}",
             "| model | batch | contender | ms | tokens/s | GB/s stored | path / torch | path / probe "
             "| per round: path / torch | path / probe |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        for name in doc["contenders"]:
            cell = r[name]
            ratios = ("| | | | |" if name != "path:native" else
                      "| " + " | ".join([f"{r[k]:.2f}" if k in r else "-" for k in ("path_vs_torch", "path_vs_probe")]
                                        + [round_text(r.get(k)) for k in ("round_path_vs_torch",
                                                                          "round_path_vs_probe")]) + " |")
            if "error" in cell:
                lines.append(f"| {r['model']} | {r['batch']} | {name} | error: {cell['error']} | | | | | | |")
                continue
            lines.append(f"| {r['model']} | {r['batch']} | {name} | {cell['ms']:.2f} | {cell['tokens_per_s']:.0f} "
                         f"| {cell['gbps']:.2f} {ratios}")
    lines.append("targets: path:native / torch <= 1.10 and path / probe within 0.90-1.10 at every batch "
                 "(per round: the median of the ratios taken within each round, with their range)")
    return lines


def round_text(ratio: dict | None) -> str:
    return "-" if ratio is None else f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--precisions", default="native", help="stored precisions of the path (comma-separated)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every contender (default 2)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink hidden sizes (a quick check)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.models = args.models.split(",")
    args.precisions = args.precisions.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        from cpu_cold_contenders import serve

        return serve(args.child, SHAPES[args.models[0]], args)
    bad = [m for m in args.models if m not in SHAPES]
    if args.rounds < 1 or args.threads < 1 or bad:
        print(f"error: unknown model {bad[0]!r}; use {', '.join(SHAPES)}" if bad else
              "error: --rounds and --threads must be at least 1", file=sys.stderr)
        return 2
    load = load_average()
    names = contenders(args.precisions)
    rows = []
    for model in args.models:
        children = [Child(n, args, model) for n in names]
        try:
            rows += rows_of(SHAPES[model], children, measure(children, args.batches, args.rounds), args.batches)
        finally:
            for c in children:
                c.close()
    doc = {"threads": args.threads, "scale": args.scale, "rounds": args.rounds, "contenders": names,
           "rows": rows, "load": load_span(load)}
    print(json.dumps(doc, indent=2) if args.json else "\n".join(render(doc)))
    return 1 if any("error" in r[n] for r in rows for n in names) else 0


if __name__ == "__main__":
    raise SystemExit(main())
