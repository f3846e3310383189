#!/usr/bin/env bash
# Builds the peers' own environment (once) and runs benchmarks/bench_peers.py in it.
#
#   benchmarks/peers_env.sh                          # every loader on every workload
#   benchmarks/peers_env.sh --workloads jpeg --rounds 7 --json /tmp/peers.json
#   PEERS_VENV=/tmp/peers benchmarks/peers_env.sh --quick
#
# The peers (torchdata, Grain, SPDL) are installed only here, in a git-ignored virtual
# environment under benchmarks/, never as dependencies of stoker. torch comes from the
# constraints file the tests use (.ci/constraints.txt: the 2.13.0 CPU build); a plain
# "torch" requirement would fetch a CUDA build of several GB. stoker itself is not
# installed: the benchmark imports it from src/ (PYTHONPATH=src).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEERS_VENV:-$ROOT/benchmarks/.peers-venv}"
PYTHON="${PYTHON:-python3.11}"
PEERS=(torch==2.13.0 torchdata==0.11.0 grain==0.2.18 spdl==0.8.0)
STOKER_DEPS=(numpy pillow simplejpeg)  # stoker's own and its [image] extra, for the JPEG workload

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -c "$ROOT/.ci/constraints.txt" "${PEERS[@]}" "${STOKER_DEPS[@]}"
fi
cd "$ROOT"
PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" benchmarks/bench_peers.py "$@"
