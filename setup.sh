#!/usr/bin/env bash
# Set up hotsplit in ./.venv (Python 3.11+). `./setup.sh --dev` adds the test tools.
#
# torch: on a machine with an NVIDIA GPU, the plain install takes PyPI's CUDA build as usual.
# Without one, a CPU-capable release is installed first (torch==2.13.0 unless TORCH_SPEC says
# otherwise) so that the install does not pull a multi-GB CUDA build it cannot use; any torch
# already in the venv that satisfies pyproject's range is kept.
set -euo pipefail
cd "$(dirname "$0")"
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: hotsplit needs Python 3.11+; $("$python" --version 2>&1) found; set PYTHON=python3.11" >&2
  exit 1
}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: installing PyPI's CUDA build of torch" >&2
  else
    echo "no NVIDIA GPU: installing ${TORCH_SPEC:-torch==2.13.0} for the CPU runtime" >&2
    "${pip[@]}" "${TORCH_SPEC:-torch==2.13.0}"
  fi
fi
"${pip[@]}" -e ".${extras}"
echo "hotsplit is ready: .venv/bin/hotsplit --help" >&2
