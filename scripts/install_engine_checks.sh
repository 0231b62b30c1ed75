#!/usr/bin/env bash
# Install the serving engines' packages that `hotsplit export`'s acceptance tests read their
# loading code from (tests/export/test_export_engines.py). They are never runtime requirements:
# each is installed with --no-deps, quietly, best effort; one that cannot be had is skipped
# and the tests that need it skip with the reason. Safe to run again: present ones are kept.
set -u
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "install_engine_checks: no .venv (run ./setup.sh --dev first); skipped" >&2; exit 0; }
pip=("$py" -m pip --quiet --disable-pip-version-check)
have() { "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }

for spec in "sglang:sglang-kt==0.7.2" "kt_kernel:kt-kernel==0.7.2" "gguf:gguf==0.19.0"; do
  mod=${spec%%:*} pkg=${spec#*:}
  have "$mod" || "${pip[@]}" install --no-deps "$pkg" >/dev/null 2>&1 \
    || echo "install_engine_checks: could not install $pkg; its export checks will skip" >&2
done

# vllm-ascend is an sdist that builds only on Ascend: download it and unpack its sources.
cache=.venv/engines  # beside the packages: gone with the venv, skipped by every source walker
ascend=vllm_ascend-0.23.0.post1
if [ ! -d "$cache/$ascend/vllm_ascend" ]; then
  mkdir -p "$cache"
  have setuptools_scm || "${pip[@]}" install setuptools_scm >/dev/null 2>&1
  if SOC_VERSION=ascend910b1 "${pip[@]}" download --no-deps --no-build-isolation \
       vllm-ascend==0.23.0.post1 -d "$cache" >/dev/null 2>&1; then
    tar -xzf "$cache/$ascend.tar.gz" -C "$cache" 2>/dev/null \
      || echo "install_engine_checks: could not unpack $ascend; its export checks will skip" >&2
  else
    echo "install_engine_checks: could not download $ascend; its export checks will skip" >&2
  fi
fi
exit 0
