#!/usr/bin/env bash
# Every GPU check from one short lease, within GPU_CHECKS_BUDGET_S (below): runtime selftest, probe,
# the kernels' cold path at fp8 and mxfp4, prefetch (outputs and counters; step time at batch 1 and
# 32 with and without it, and the staging copies hidden under compute), full-size side-by-side
# benchmark, the test suite's CUDA tests (all of them: no -x), runtime and probe benchmarks. A step that fails is re-run once with
# CUDA_LAUNCH_BLOCKING=1 (its first logs kept; for the tests only the failing ids) while the budget
# allows.
#
# Exit code: 1 when any step failed on its first run, else 0.
# Results: $OUT (default ./gpu_checks_out) receives two files, gpu_checks.tar.gz (every log and
# JSON document, also on an early exit) and summary.txt (the table printed at the end).
#
#   OUT=/tmp/out bash scripts/gpu_checks.sh
#   GPU_CHECKS_ALLOW_CPU=1 OUT=/tmp/out bash scripts/gpu_checks.sh   # check the script on a CPU
#
# Time: every step runs under its own `timeout`, clipped to what is left of GPU_CHECKS_BUDGET_S
# (default 400 s, counted from the start and covering set-up, steps and re-runs; the summary and
# the tarball follow in seconds), keeping 10 s for each step not yet started while the budget
# allows. A step or re-run that would get less than 10 s is skipped, and the summary says so.
set -u
T0=$SECONDS
BUDGET_S="${GPU_CHECKS_BUDGET_S:-400}"
MIN_STEP_S=10
cd "$(dirname "$0")/.." || exit 1
OUT_DIR="${OUT:-./gpu_checks_out}"
mkdir -p "$OUT_DIR" || exit 1
rm -f "$OUT_DIR/gpu_checks.tar.gz" "$OUT_DIR/summary.txt"  # never leave a previous run's results
W="$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks.XXXXXX")" || exit 1
: >"$W/status.tsv"
: >"$W/notes.txt"

note() { echo "$*" | tee -a "$W/notes.txt" >&2; }

finish() {
  local rc=$?
  trap - EXIT
  [ -f "$OUT_DIR/summary.txt" ] || cp "$W/notes.txt" "$OUT_DIR/summary.txt"  # an early exit says why
  tar -czf "$OUT_DIR/gpu_checks.tar.gz" -C "$W" . || echo "error: could not write $OUT_DIR/gpu_checks.tar.gz" >&2
  rm -rf "$W"
  echo "results: $OUT_DIR/gpu_checks.tar.gz and $OUT_DIR/summary.txt ($((SECONDS - T0)) s in all)" >&2
  exit "$rc"
}
trap finish EXIT
trap 'note "interrupted"; exit 130' INT TERM

remaining() { echo $((BUDGET_S - (SECONDS - T0))); }

# The Python to use: $PYTHON, else a .venv whose torch sees a GPU, else python3 (a GPU image's
# own Python, which usually holds CUDA torch and triton already).
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && timeout 60 .venv/bin/python -c \
      "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
# A machine with no network gets missing packages as wheels carried in .whl/ (e.g. orjson),
# installed into a private folder rather than into that Python.
if compgen -G ".whl/*.whl" >/dev/null; then
  timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/hotsplit_site \
    .whl/*.whl >>"$W/pip.log" 2>&1 && export PYTHONPATH="/tmp/hotsplit_site${PYTHONPATH:+:$PYTHONPATH}"
fi
# hotsplit itself runs from this checkout (python -m hotsplit_cli): no install needed. The
# folders runtime/ and probes/ import as hotsplit_runtime and hotsplit_probes (pyproject's
# package-dir), so a private folder links them under those names.
SRC_LINKS=$(mktemp -d /tmp/hotsplit_src.XXXXXX)
ln -s "$PWD/runtime" "$SRC_LINKS/hotsplit_runtime" && ln -s "$PWD/probes" "$SRC_LINKS/hotsplit_probes"
export PYTHONPATH="$PWD:$SRC_LINKS${PYTHONPATH:+:$PYTHONPATH}"
DEPS="torch triton typer rich yaml psutil numpy orjson pynvml pytest"
missing() { "$PY" -c "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m) is None])" $DEPS; }
if [ -n "$(missing)" ]; then  # with a network: the package and its GPU extra
  timeout 120 "$PY" -m pip install -q -e ".[gpu]" >>"$W/pip.log" 2>&1 || true
fi
if [ -n "$(missing)" ]; then
  note "error: $PY lacks: $(missing) (no network? carry wheels in .whl/; see pip.log in the tarball)"
  exit 1
fi
HAS_CUDA=0
timeout 60 "$PY" - >"$W/env.out" 2>&1 <<'PYEOF' && HAS_CUDA=1
import platform, sys, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {platform.python_version()}, {gpu}")
sys.exit(0 if torch.cuda.is_available() else 3)
PYEOF
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi >>"$W/env.out" 2>&1
head -n 1 "$W/env.out"
# GPU_CHECKS_ALLOW_CPU=1 runs the whole script on a CPU (to check the script itself).
if [ "$HAS_CUDA" = 0 ] && [ -z "${GPU_CHECKS_ALLOW_CPU:-}" ]; then
  note "error: $(head -n 1 "$W/env.out"): torch sees no CUDA GPU, and every check here needs one"
  exit 1
fi
HS=("$PY" -m hotsplit_cli)

# run_step NAME RUN NOMINAL_S COMMAND...: RUN is "first" or "blocking" (CUDA_LAUNCH_BLOCKING=1).
# stdout and stderr go to $W/NAME[.blocking].out / .err; one line per run in status.tsv.
# Returns the command's exit code, or 99 when skipped for lack of budget.
RESERVE_S=0
run_step() {
  local name=$1 run=$2 nominal=$3
  shift 3
  local log="$W/$name"
  [ "$run" = blocking ] && log="$W/$name.blocking"
  local left=$(( $(remaining) - RESERVE_S - 5 ))  # 5: timeout's grace before SIGKILL
  # Short of the reserve, the earlier (more needed) step takes what is left.
  [ "$left" -lt "$MIN_STEP_S" ] && left=$(( $(remaining) - 5 ))
  local limit=$(( nominal < left ? nominal : left ))
  if [ "$limit" -lt "$MIN_STEP_S" ]; then
    printf '%s\t%s\tskipped\t0\t%s\t%s\n' "$name" "$run" "$nominal" "budget: $(remaining) s left" >>"$W/status.tsv"
    note "$name ($run run): skipped, $(remaining) s of the budget left"
    return 99
  fi
  local t0=$SECONDS rc
  if [ "$run" = blocking ]; then
    CUDA_LAUNCH_BLOCKING=1 timeout -k 5 "$limit" "$@" >"$log.out" 2>"$log.err"
  else
    timeout -k 5 "$limit" "$@" >"$log.out" 2>"$log.err"
  fi
  rc=$?
  local why=""
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="timed out after ${limit} s"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$run" "$rc" "$((SECONDS - t0))" "$limit" "$why" >>"$W/status.tsv"
  printf '%-16s %-9s rc=%-3s %4ss of %4ss  %s\n' "$name" "$run" "$rc" "$((SECONDS - t0))" "$limit" "$why"
  return "$rc"
}

# The steps, most needed first. Each takes the run ("first" or "blocking").
CUDA_TEST_FILES=(tests/runtime/test_runtime_bank.py tests/runtime/test_runtime_core.py tests/cli/test_run_cli.py tests/probes/test_probe_gpu.py
                 tests/runtime/test_hf_stored_precision.py
                 tests/cli/test_probe_cli.py tests/runtime/test_hf_models.py)
step_selftest() { run_step selftest "$1" 90 "${HS[@]}" selftest --json; }
step_probe() { run_step probe "$1" 45 "${HS[@]}" probe --json --recipe recipes/deepseek-v3.yaml; }
# The kernels' cold path at fp8 and mxfp4 (GB/s of stored bytes vs the raw zero-copy read); the
# selftest step checks both formats against the reference and measures bf16 and fp8.
step_cold_formats() {
  local args=(--json)
  [ "$HAS_CUDA" = 1 ] || args+=(--scale 0.02 --reps 1)  # a CPU checks the script CPU-sized
  run_step cold_formats "$1" 30 "$PY" benchmarks/bench_cold_formats.py "${args[@]}"
}
step_bench_full() {
  local args=(--full-size --json)
  [ "$HAS_CUDA" = 1 ] || args+=(--scale 0.02)  # a CPU runs the same table CPU-sized
  [ -s "$W/probe.out" ] && args+=(--platform "$W/probe.out")  # cold GB/s against the probe's zero-copy read
  run_step bench_full "$1" 120 "$PY" benchmarks/bench_runtime.py "${args[@]}"
}
step_cuda_tests() {
  local pytest=("$PY" -m pytest -p no:cacheprovider -o addopts= -v -rfE)  # -v: one line per test, even if killed
  if [ "$1" = first ]; then  # no -x: every CUDA test runs
    run_step cuda_tests first 90 "${pytest[@]}" -k "cuda or gpu" "${CUDA_TEST_FILES[@]}"
    return
  fi
  local ids=()
  mapfile -t ids < <("$PY" scripts/gpu_summary.py --failed-tests "$W/cuda_tests.out")
  if [ "${#ids[@]}" = 0 ]; then  # no failing id (a collection error, a crash): the whole selection again
    run_step cuda_tests blocking 90 "${pytest[@]}" -k "cuda or gpu" "${CUDA_TEST_FILES[@]}"
  else
    run_step cuda_tests blocking 90 "${pytest[@]}" "${ids[@]}"
  fi
}
step_bench_runtime() {
  local args=(--json --reps 10)
  # On a GPU: DeepSeek-V3 experts at a quarter of their size (a CPU gets the tiny recipe).
  [ "$HAS_CUDA" = 1 ] && args+=(--recipe deepseek-v3 --scale 0.25 --layers 2)
  # Making 256 experts' weights and their fp8 bytes takes most of it: 30 s was not enough on an H200.
  run_step bench_runtime "$1" 60 "$PY" benchmarks/bench_runtime.py "${args[@]}"
}
step_bench_probe() { run_step bench_probe "$1" 30 "$PY" benchmarks/bench_probe.py; }
step_bench_cold_path() {
  local args=()
  [ "$HAS_CUDA" = 1 ] || args+=(--scale 0.1)  # a CPU checks the script CPU-sized
  [ -s "$W/probe.out" ] && args+=(--platform "$W/probe.out")  # the probe's rates, as `run --platform` takes them
  run_step bench_cold_path "$1" 40 "$PY" benchmarks/bench_cold_path.py --rounds 3 "${args[@]}"
}

# Expert parallelism: 4 ranks sharing the GPU (gloo), NCCL when each rank has a GPU of its own.
step_ep_run() { run_step ep_run "$1" 60 "${HS[@]}" run tiny-ep4 --steps 10 --json; }
# The suite's EP tests (every token against the reference, a rebalance mid-run) with every rank on the GPU.
step_ep_tests() {
  # -v: one line per test, even if the step is killed
  HOTSPLIT_TEST_EP_DEVICE=cuda run_step ep_tests "$1" 120 "$PY" -m pytest -v --tb=short -rfE -p no:cacheprovider \
    tests/runtime/test_ep.py -k "reference"
}

# Prefetch into staging slots: outputs equal prefetch off (graph and no graph), counters equal simulate's.
step_prefetch() { run_step prefetch "$1" 30 "$PY" scripts/check_prefetch_gpu.py "$(mktemp -d)"; }
# Prefetch's price: batch-1 and batch-32 steps, prefetch off and trace side by side, and how much of
# the staging copies' time the compute stream hid.
step_prefetch_timing() {
  local args=(--json)
  [ "$HAS_CUDA" = 1 ] || args+=(--dry)  # a CPU checks the script CPU-sized
  run_step prefetch_timing "$1" 60 "$PY" benchmarks/bench_prefetch_gpu.py "${args[@]}"
}

STEPS=(selftest probe cold_formats prefetch prefetch_timing bench_full cuda_tests bench_runtime bench_probe)
[ -f benchmarks/bench_cold_path.py ] && STEPS+=(bench_cold_path)
STEPS+=(ep_run ep_tests)
# GPU_CHECKS_STEPS="selftest prefetch" runs only those steps (a re-run after a fix).
if [ -n "${GPU_CHECKS_STEPS:-}" ]; then read -ra STEPS <<<"$GPU_CHECKS_STEPS"; fi
FAILED=()
left=${#STEPS[@]}
for s in "${STEPS[@]}"; do
  left=$((left - 1))
  RESERVE_S=$((left * MIN_STEP_S))  # a slow step never takes the last seconds of the ones after it
  "step_$s" first
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    note "$s timed out: not re-run (a blocking re-run would take longer still)"
  elif [ "$rc" != 0 ] && [ "$rc" != 99 ]; then
    FAILED+=("$s")
  fi
done
RESERVE_S=0
for s in "${FAILED[@]+"${FAILED[@]}"}"; do
  "step_$s" blocking
done

echo
timeout 60 "$PY" scripts/gpu_summary.py "$W" >"$W/summary.txt" 2>"$W/summary.err" \
  || echo "summary failed: $(tail -n 3 "$W/summary.err")" >>"$W/summary.txt"
cp "$W/summary.txt" "$OUT_DIR/summary.txt"
cat "$W/summary.txt"
# Exit 1 when a step failed or timed out on its first run (skips for lack of budget do not count).
awk -F'\t' '$2 == "first" && $3 != "0" && $3 != "skipped" { bad = 1 } END { exit bad }' "$W/status.tsv"
