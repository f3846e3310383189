#!/usr/bin/env bash
# Builds the DALI comparison's own environment (once) and runs benchmarks/bench_vision.py in it.
#
#   benchmarks/dali_env.sh                                   # both image sizes, every loader
#   benchmarks/dali_env.sh --sizes small --rounds 7 --json /tmp/vision.json
#   DALI_VENV=/tmp/dali benchmarks/dali_env.sh --loaders stoker,dali --batches 6
#
# NVIDIA DALI (its CPU pipeline: no GPU is needed or used) is installed only here, in a
# git-ignored virtual environment under benchmarks/, never as a dependency of stoker, and
# so are the other packages the comparison needs. torch comes from the constraints file the
# tests use (.ci/constraints.txt: the 2.13.0 CPU build); a plain "torch" requirement would
# fetch a CUDA build of several GB. stoker itself is not installed: the benchmark imports
# it from src/ (PYTHONPATH=src), so a run measures the work tree as it is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DALI_VENV:-$ROOT/benchmarks/.dali-venv}"
PYTHON="${PYTHON:-python3.11}"
PEERS=(nvidia-dali-cuda120==2.4.0 torch==2.13.0)
STOKER_DEPS=(numpy==2.4.6 pillow==13.0.0 simplejpeg==1.9.0)  # stoker's own and its [image] extra

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -c "$ROOT/.ci/constraints.txt" "${PEERS[@]}" "${STOKER_DEPS[@]}"
fi
cd "$ROOT"
PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" benchmarks/bench_vision.py "$@"
