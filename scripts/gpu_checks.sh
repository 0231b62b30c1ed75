#!/usr/bin/env bash
# Every GPU check in one go (about 5 minutes on an H200): runtime selftest, probe, probe and
# runtime benchmarks. Results go to $OUT (or ./gpu_checks_out) and a short table is printed.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./gpu_checks_out}"
mkdir -p "$OUT_DIR"
# The Python to use: $PYTHON, else a .venv whose torch sees a GPU, else python3 (a GPU image's
# own Python, which usually holds CUDA torch and triton already).
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" \
      2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
# A machine with no network gets missing packages as wheels carried in .whl/ (e.g. orjson),
# installed into a private folder rather than into that Python.
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/hotsplit_site .whl/*.whl \
    >>"$OUT_DIR/pip.log" 2>&1 && export PYTHONPATH="/tmp/hotsplit_site${PYTHONPATH:+:$PYTHONPATH}"
fi
# hotsplit itself runs from this checkout (python -m hotsplit_cli): no install needed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEPS="torch triton typer rich yaml psutil numpy orjson pynvml"
missing() { "$PY" -c "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m) is None])" $DEPS; }
if [ -n "$(missing)" ]; then  # with a network: the package and its GPU extra
  "$PY" -m pip install -q -e ".[gpu]" >>"$OUT_DIR/pip.log" 2>&1 || true
fi
if [ -n "$(missing)" ]; then
  echo "error: $PY lacks: $(missing) (no network? carry wheels in .whl/; see $OUT_DIR/pip.log)" >&2
  exit 1
fi
# GPU_CHECKS_ALLOW_CPU=1 runs the whole script on a CPU (to check the script itself).
if [ -z "${GPU_CHECKS_ALLOW_CPU:-}" ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" \
    2>/dev/null; then
  echo "error: $("$PY" -c 'import torch; print("torch", torch.__version__, "(CUDA", torch.version.cuda, end=")")' 2>&1)" \
       "sees no CUDA GPU, and every check here needs one" >&2
  exit 1
fi
HS=("$PY" -m hotsplit_cli)

declare -A STATUS
run_check() {  # name timeout_s outfile command...
  local name=$1 limit=$2 file=$3; shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT_DIR/$file" 2>"$OUT_DIR/$file.err"
  local rc=$?
  STATUS[$name]="rc=$rc $((SECONDS - t0))s"
  printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$OUT_DIR/$file"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" \
  >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

run_check selftest 150 selftest.json "${HS[@]}" selftest --json
if "${HS[@]}" probe --help >/dev/null 2>&1; then
  run_check probe 120 probe.json "${HS[@]}" probe --json --recipe recipes/deepseek-v3.yaml
else
  echo "probe              skipped (no \`hotsplit probe\` command)"
fi
if [ -f benchmarks/bench_probe.py ]; then
  run_check bench_probe 90 bench_probe.txt "$PY" benchmarks/bench_probe.py
fi
BENCH_ARGS=(--reps 20)
# On a GPU: DeepSeek-V3 experts at a quarter of their size (a CPU gets the tiny recipe).
if [ -f recipes/deepseek-v3.yaml ] && "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  BENCH_ARGS+=(--recipe deepseek-v3 --scale 0.25 --layers 2)
fi
run_check bench_runtime 150 bench_runtime.json "$PY" benchmarks/bench_runtime.py --json "${BENCH_ARGS[@]}"
# The test files whose CUDA-only tests skip on a CPU (zero-copy views, graph replay, swaps in flight,
# pinned cold banks of real checkpoints, probe measurements): here they run.
run_check cuda_tests 180 cuda_tests.txt "$PY" -m pytest -p no:cacheprovider -x -k "cuda or gpu" \
  tests/test_runtime_bank.py tests/test_runtime_core.py tests/test_run_cli.py tests/test_probe_gpu.py \
  tests/test_probe_cli.py tests/test_hf_models.py

# The short table: selftest checks, zero-copy numbers vs the probe's, runtime ratios.
"$PY" - "$OUT_DIR" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except Exception as exc:
        print(f"{name}: unreadable ({exc})"); return None
st = load("selftest.json")
if st:
    print("\nselftest ok:", st["ok"], "| kernel:", st["kernel"])
    for c in st["checks"]:
        flag = {True: "pass", False: "FAIL", None: "-"}[c["ok"]]
        print(f"  {c['name'][:44]:44} {flag:5} {c['value']:>22}  {c['detail']}")
    zc = st.get("measures", {}).get("zero_copy")
    pr = load("probe.json") if (out / "probe.json").exists() else None
    if zc and pr:
        def medians(node, inside=False):  # every median_gbps under a "zero_copy_read" key
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "median_gbps" and inside and isinstance(v, (int, float)):
                        yield v
                    else:
                        yield from medians(v, inside or k == "zero_copy_read")
            elif isinstance(node, list):
                for v in node:
                    yield from medians(v, inside)
        found = list(medians(pr))
        if found:
            g = max(found)
            print(f"  cold path {zc['cold_path_gbps']:.1f} GB/s vs probe zero-copy {g:.1f} GB/s "
                  f"= {100 * zc['cold_path_gbps'] / g:.0f}% (target >= 80%)")
            if zc.get("cold_path_fp8_gbps"):
                print(f"  cold path, fp8 experts {zc['cold_path_fp8_gbps']:.1f} GB/s "
                      f"= {100 * zc['cold_path_fp8_gbps'] / g:.0f}% of the probe's zero-copy read")
        else:
            print("  no zero_copy_read median in probe.json; compare by hand")
br = load("bench_runtime.json")
if br:
    print(f"\nbench_runtime {br['recipe']} on {br['device']} ({br['kernel']})")
    for r in br["rows"]:
        print(f"  batch {r['batch']:>3} hot {100 * r['hot_fraction']:>3.0f}%  runtime {r['runtime_ms']:8.3f} ms"
              f"  reference {r['reference_ms']:8.3f} ms  ratio {r['ratio']:.3f}")
PYEOF
if [ -f "$OUT_DIR/cuda_tests.txt" ]; then
  echo
  echo "CUDA tests: $(tail -n 1 "$OUT_DIR/cuda_tests.txt")"
fi
if [ -f "$OUT_DIR/bench_probe.txt" ]; then
  echo
  cat "$OUT_DIR/bench_probe.txt"
fi
