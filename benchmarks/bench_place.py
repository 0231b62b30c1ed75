"""Place time and quality on DeepSeek-V3 geometry: hotsplit vs a port of the EPLB reference, and
the CLI time of `plan` and `place` above `hotsplit --help`.

Geometry (deepseek-ai/DeepSeek-V3 config.json): 61 layers, first_k_dense_replace 3 -> 58 MoE
layers, n_routed_experts 256, n_group 8; deployment as in DeepSeek's inference-system overview:
32 ranks (EP32), 32 redundant experts -> 288 physical experts, 9 per rank; hierarchical = 4 nodes.

Traffic: SGLang's DeepSeek-R1 distributions in `../shared/data/routing` next to the repository
(see that folder's README; not in the repository): the three pairs it names, fitted on the first
file of a pair and judged on the second. Without the folder the script says so and uses
heavy-tailed synthetic counts, with a later window resampled from them under multiplicative drift.

Then every way of fitting that was tried for later traffic, with its later-window balancedness
(pair by pair, flat then hierarchical) and its worst gap to EPLB's.

Where sglang is installed (`pip install --no-deps sglang` is enough: its two algorithm files
import only torch), SGLang's shipped `deepseek` (DeepSeek's EPLB code) and `deepseek_vec` are
timed beside the port, and the port's layouts are compared with `deepseek`'s slot for slot.
Without sglang that part is skipped with one line.

Method: every function is called once before timing (so no row pays an import or a first-call
cost), then the rows are timed in turn, three rounds interleaved (round 1 of every row, then
round 2 of every row, ...), and each row reports its best round. Ratios are printed with two
significant digits: below 1 a row is slower than the reference.

Run: .venv/bin/python benchmarks/bench_place.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eplb_port  # noqa: E402
from reporting import load_average, load_span  # noqa: E402

from hotsplit_cli.placement.algorithm import Geometry, Placement, place_experts  # noqa: E402
from hotsplit_cli.placement.evaluate import duplicate_count, eplb_layout, evaluate  # noqa: E402
from hotsplit_cli.traffic.hist import Histogram, save_hist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROUTING = ROOT.parent / "shared" / "data" / "routing"
PAIRS = (("prefill_in1024", "prefill_in4096"), ("decode_in1000out1000", "decode_in2000out100"),
         ("prefill_in1000out1000", "decode_in1000out1000"))  # stable, drift, phase shift (data README)
L, E, RANKS, REDUNDANT, GROUPS, NODES = 58, 256, 32, 32, 8, 4
ROUNDS = 3


def sig2(x: float) -> str:
    """A ratio with two significant digits: 0.74, 13, 140."""
    return f"{float(f'{x:.2g}'):g}"


def timed_rows(rows: dict, rounds: int = ROUNDS) -> dict:
    """Best time (s) and result of each row's callable: one warm-up call each, then `rounds`
    rounds interleaved across the rows."""
    out = {name: [np.inf, fn()] for name, fn in rows.items()}  # warm-up
    for _ in range(rounds):
        for name, fn in rows.items():
            t = time.perf_counter()
            out[name][1] = fn()
            out[name][0] = min(out[name][0], time.perf_counter() - t)
    return out


def load_counts(path: Path) -> np.ndarray:
    """One SGLang distribution as counts [58 MoE layers, 256 experts] (rows 0-2: dense layers)."""
    return np.array(json.loads(path.read_text())["logical_count"], dtype=float)[3:]


def load_pairs() -> tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    paths = [(ROUTING / f"sglang-r1-{a}.json", ROUTING / f"sglang-r1-{b}.json") for a, b in PAIRS]
    if all(p.exists() for pair in paths for p in pair):
        load = load_counts
        return f"real: {ROUTING}", [(f"{a} -> {b}", load(pa), load(pb))
                                    for (a, b), (pa, pb) in zip(PAIRS, paths, strict=True)]
    print(f"note: {ROUTING} is absent (see the routing README); using synthetic counts")
    rng = np.random.default_rng(0)
    fit = rng.gamma(0.5, size=(L, E)) * 1e5
    drift = fit * rng.gamma(8, size=fit.shape)
    later = np.stack([rng.multinomial(int(c.sum()), q / q.sum()) for c, q in zip(fit, drift, strict=True)])
    return "synthetic gamma(0.5), later = gamma(8) drift", [("synthetic", fit, later.astype(float))]


def layouts(fit: np.ndarray, geo: Geometry) -> dict:
    """The rows timed side by side: name -> a callable returning the layout fitted on `fit`."""
    g, n = geo.num_groups, geo.num_nodes

    def ref():
        return eplb_port.rebalance_experts(fit, E + REDUNDANT, g, n, RANKS, packing=eplb_port.balanced_packing_tensor)

    return {
        "EPLB port, tensor loops (reference)": lambda: Placement(tuple(range(L)), RANKS, ref()[0]),
        "EPLB port, numpy + lists": lambda: Placement(
            tuple(range(L)), RANKS, eplb_port.rebalance_experts(fit, E + REDUNDANT, g, n, RANKS)[0]),
        "hotsplit totals-only (EPLB-style)": lambda: eplb_layout(fit, range(L), geo),
        "hotsplit place": lambda: place_experts(fit[None], range(L), geo),
    }


def in_process(source: str, pairs) -> None:
    print(f"traffic: {source}; {L} layers x {E} experts, {RANKS} ranks, {REDUNDANT} redundant")
    print("| pair | mode | layout | place ms | speed-up vs reference | balancedness fitted | balancedness later "
          "| dup (layer, rank) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, fit, later in pairs:
        for nodes, groups in ((1, 1), (NODES, GROUPS)):
            geo = Geometry(RANKS, REDUNDANT, nodes, groups)
            mode = "hier" if nodes > 1 else "flat"
            rows = layouts(fit, geo)
            res = timed_rows(rows)
            t_ref = res["EPLB port, tensor loops (reference)"][0]
            for label, (t, lay) in res.items():
                print(f"| {name} | {mode} | {label} | {t * 1e3:.1f} | {sig2(t_ref / t)}x "
                      f"| {evaluate(fit[None], lay).balancedness:.4f} | {evaluate(later[None], lay).balancedness:.4f} "
                      f"| {duplicate_count(lay)} |")


def cli_times(fit: np.ndarray) -> None:
    """`hotsplit --help`, `plan` and `place` on a 58 x 256 histogram, each as its own process."""
    exe = Path(sys.executable).with_name("hotsplit")
    if not exe.exists():
        print(f"note: no {exe}: the CLI times need the installed console script (./setup.sh)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        hist = save_hist(Path(tmp) / "hist.json", Histogram(
            "deepseek-v3", "benchmarks/bench_place.py", 8, int(fit.sum() // 8), tuple(range(3, 61)), fit))
        runs = {
            "hotsplit --help": [str(exe), "--help"],
            "hotsplit plan (58 x 256, deepseek-v3, 20 GiB)": [
                str(exe), "plan", str(hist), "--recipe", "deepseek-v3", "--hot-gib", "20", "-o", f"{tmp}/plan.json"],
            "hotsplit place (32 ranks, 32 redundant)": [
                str(exe), "place", str(hist), "--ranks", "32", "--redundant", "32", "-o", f"{tmp}/place.json"],
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOTSPLIT_")}

        def run(argv):
            def go():
                r = subprocess.run(argv, capture_output=True, text=True, env=env)
                if r.returncode:
                    raise SystemExit(f"{' '.join(argv)} failed: {r.stderr.strip()}")
            return go
        res = timed_rows({k: run(v) for k, v in runs.items()})
    base = res["hotsplit --help"][0]
    print("| command (own process) | wall s, best of 3 | above `hotsplit --help` s |")
    print("| --- | ---: | ---: |")
    for label, (t, _) in res.items():
        print(f"| {label} | {t:.3f} | {t - base:+.3f} |")


def _custom_replicas(fit: np.ndarray, geo: Geometry, score) -> Placement:
    """Flat layout with replicas given one by one to argmax score(weight, replicas), then
    hotsplit's packer."""
    from hotsplit_cli.placement.algorithm import _slots_from_packs, expand_replicas, pack_items

    cnt = np.ones(fit.shape, dtype=np.int64)
    rows = np.arange(fit.shape[0])
    for _ in range(geo.num_redundant):
        cnt[rows, np.argmax(np.where(cnt >= geo.num_ranks, -np.inf, score(fit, cnt)), axis=1)] += 1
    items = expand_replicas(cnt)
    per = np.take_along_axis(fit, items, 1) / np.take_along_axis(cnt, items, 1)
    pack = pack_items(per[None], geo.num_ranks, items)
    return Placement(tuple(range(L)), geo.num_ranks, _slots_from_packs(items, pack, geo.num_ranks))


def later_window_methods(pairs) -> None:
    """Every way of fitting tried for later traffic, fitted on the first file of each pair and
    judged on the second (flat and hierarchical): balancedness later, and its gap to EPLB's."""
    rng = np.random.default_rng(0)

    def noisy_windows(fit, sigma=0.3, w=8):  # lognormal resamples: a risk model for one window
        return fit[None] * np.exp(sigma * rng.standard_normal((w, *fit.shape)) - sigma ** 2 / 2)

    methods = {
        "EPLB port (reference)": lambda fit, geo: Placement(tuple(range(L)), RANKS, eplb_port.rebalance_experts(
            fit, E + REDUNDANT, geo.num_groups, geo.num_nodes, RANKS)[0]),
        "hotsplit place (default)": lambda fit, geo: place_experts(fit[None], range(L), geo),
        "place on counts^0.8 (hedge toward uniform)": lambda fit, geo: place_experts(fit[None] ** 0.8, range(L), geo),
        "place on 8 lognormal resamples, sigma 0.3, as windows": lambda fit, geo: place_experts(
            noisy_windows(fit), range(L), geo),
        "replicas by variance, w / sqrt(c (c + 1))":
            lambda fit, geo: _custom_replicas(fit, geo, lambda w, c: w / np.sqrt(c * (c + 1)))
            if geo.num_nodes == 1 else None,
    }
    print("| method | later balancedness per pair-mode | mean | min vs EPLB |")
    print("| --- | --- | ---: | ---: |")
    ref = None
    for label, fn in methods.items():
        got = []
        for _, fit, later in pairs:
            for nodes, groups in ((1, 1), (NODES, GROUPS)):
                lay = fn(fit, Geometry(RANKS, REDUNDANT, nodes, groups))
                got.append(np.nan if lay is None else evaluate(later[None], lay).balancedness)
        got = np.array(got)
        ref = got if ref is None else ref
        ok = ~np.isnan(got)
        if not ok.all():  # a method for some pair-modes only: its mean beside EPLB's over the same ones
            label = f"{label} (flat only: mean of the flat pairs, EPLB {ref[ok].mean():.4f})"
        print(f"| {label} | {' '.join('-' if np.isnan(g) else f'{g:.4f}' for g in got)} | {got[ok].mean():.4f} "
              f"| {(got[ok] - ref[ok]).min():+.4f} |")


def sglang_algorithms():
    """SGLang's shipped `deepseek` and `deepseek_vec` modules, and how they were loaded; (None,
    reason) when sglang is absent. The two files import only torch, while the `sglang` package's
    __init__ imports its serving stack: when that stack is missing (`pip install --no-deps sglang`),
    the two files are loaded from the installed package as they are, without the package."""
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None, "sglang is not installed"
    try:
        from sglang.srt.eplb.eplb_algorithms import deepseek, deepseek_vec
        return (deepseek, deepseek_vec), "imported"
    except ImportError as exc:
        why = f"`import sglang` needs {exc.name or exc}"
    folder = Path(spec.submodule_search_locations[0]) / "srt" / "eplb" / "eplb_algorithms"
    mods = []
    for name in ("deepseek", "deepseek_vec"):
        path = folder / f"{name}.py"
        if not path.exists():
            return None, f"sglang has no {path}"
        mspec = importlib.util.spec_from_file_location(f"sglang_eplb_{name}", path)
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
        mods.append(mod)
    return tuple(mods), f"{why}; loaded {folder}/deepseek.py and deepseek_vec.py directly"


def sglang_rows(mods, fit: np.ndarray, nodes: int, groups: int) -> dict:
    """SGLang's two algorithms and the port's two forms, each a callable returning phy2log [L, P]."""
    import torch

    deepseek, deepseek_vec = mods
    w, hier, geo = torch.tensor(fit), nodes > 1, Geometry(RANKS, REDUNDANT, nodes, groups)
    return {
        "SGLang deepseek": lambda: deepseek.rebalance_experts(
            w, E + REDUNDANT, groups, nodes, RANKS, enable_hierarchical=hier)[0].numpy(),
        "SGLang deepseek_vec": lambda: deepseek_vec.rebalance_experts(
            w[None], E + REDUNDANT, (E + REDUNDANT) // RANKS, groups, nodes, enable_hierarchical=hier)[0].to(
            torch.int64).numpy(),
        "EPLB port, tensor loops": lambda: eplb_port.rebalance_experts(
            fit, E + REDUNDANT, groups, nodes, RANKS, packing=eplb_port.balanced_packing_tensor)[0],
        "EPLB port, numpy + lists": lambda: eplb_port.rebalance_experts(fit, E + REDUNDANT, groups, nodes, RANKS)[0],
        "hotsplit place": lambda: place_experts(fit[None], range(L), geo).phy2log_LP,
    }


def sglang_check(pairs) -> None:
    """SGLang's own `deepseek` (DeepSeek's EPLB code) and `deepseek_vec`, timed beside the port
    (warm, best of 3, interleaved), with their balancedness and whether the port's layout equals
    `deepseek`'s slot for slot."""
    mods, how = sglang_algorithms()
    if mods is None:
        print(f"note: {how}: the comparison with SGLang's own `deepseek` and `deepseek_vec` algorithms is skipped")
        return
    import importlib.metadata

    import torch

    deepseek = mods[0]
    print(f"SGLang {importlib.metadata.version('sglang')} EPLB algorithms ({how})")
    print("| pair | mode | layout | place ms | vs port (tensor loops) | vs SGLang deepseek | balancedness fitted "
          "| balancedness later | layers equal to SGLang deepseek |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    differ_tied = []  # (layers where the numpy port differs from SGLang deepseek, how many of them have tied counts)
    for name, fit, later in pairs:
        for nodes, groups in ((1, 1), (NODES, GROUPS)):
            hier = nodes > 1
            rows = sglang_rows(mods, fit, nodes, groups)
            res = timed_rows(rows)
            t_port = res["EPLB port, tensor loops"][0]
            t_real, real = res["SGLang deepseek"]
            for label, (t, phy2log) in res.items():
                lay = Placement(tuple(range(L)), RANKS, np.asarray(phy2log, dtype=np.int64))
                same = (np.asarray(phy2log) == real).all(axis=1)
                equal = int(same.sum())
                if label == "EPLB port, numpy + lists":
                    differ_tied.append((int((~same).sum()),
                                        sum(len(np.unique(fit[x])) < E for x in np.flatnonzero(~same))))
                print(f"| {name} | {'hier' if hier else 'flat'} | {label} | {t * 1e3:.1f} | {sig2(t_port / t)}x "
                      f"| {sig2(t_real / t)}x "
                      f"| {evaluate(fit[None], lay).balancedness:.4f} | {evaluate(later[None], lay).balancedness:.4f} "
                      f"| {'-' if label.startswith('hotsplit') else f'{equal} of {L}'} |")
    differ, tied = map(sum, zip(*differ_tied, strict=True))
    print(f"The numpy port differs from SGLang deepseek in {differ} of {L * len(differ_tied)} layer layouts; "
          f"{tied} of those layers have tied counts (torch's unstable sort orders equal items its own way, "
          "the port by index).")
    rng = np.random.default_rng(0)
    untied = rng.gamma(0.5, size=(L, E)) * 1e5  # continuous counts: no ties
    for nodes, groups in ((1, 1), (NODES, GROUPS)):
        real = deepseek.rebalance_experts(torch.tensor(untied), E + REDUNDANT, groups, nodes, RANKS,
                                          enable_hierarchical=nodes > 1)[0].numpy()
        port = eplb_port.rebalance_experts(untied, E + REDUNDANT, groups, nodes, RANKS)[0]
        print(f"Tie-free counts (gamma(0.5) x 1e5), {'hier' if nodes > 1 else 'flat'}: the numpy port equals "
              f"SGLang deepseek slot for slot in {int((port == real).all(axis=1).sum())} of {L} layers.")


def main() -> None:
    load = load_average()
    source, pairs = load_pairs()
    in_process(source, pairs)
    later_window_methods(pairs)
    cli_times(pairs[0][1])
    sglang_check(pairs)
    print(f"\n{load_span(load)}, over the whole run")


if __name__ == "__main__":
    main()
