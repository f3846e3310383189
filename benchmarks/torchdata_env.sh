#!/usr/bin/env bash
# Builds the torchdata suite's own environment (once) and runs benchmarks/torchdata_suite.py in it.
#
#   benchmarks/torchdata_env.sh --test-dir /path/to/data/test/stateful_dataloader
#   benchmarks/torchdata_env.sh --test-dir DIR --files test_sampler.py -k state --json out.json
#   TORCHDATA_VENV=/tmp/td benchmarks/torchdata_env.sh --test-dir DIR
#
# torchdata and what its StatefulDataLoader tests import (expecttest, parameterized, psutil,
# datasets) are installed only here, in a git-ignored virtual environment under benchmarks/,
# never as dependencies of stoker. torch comes from the constraints file the tests use
# (.ci/constraints.txt: the 2.13.0 CPU build); a plain "torch" requirement would fetch a CUDA
# build of several GB. stoker itself is not installed: the suite imports it from src/
# (PYTHONPATH=src), so the run tests the work tree as it is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TORCHDATA_VENV:-$ROOT/benchmarks/.torchdata-venv}"
PYTHON="${PYTHON:-python3.11}"
SUITE=(torch==2.13.0 torchdata==0.11.0 pytest==9.2.0 pytest-timeout==2.4.0 expecttest==0.3.0
       parameterized==0.9.0 psutil==7.2.2 datasets==5.2.0)
STOKER_DEPS=(numpy==2.4.6)

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -c "$ROOT/.ci/constraints.txt" "${SUITE[@]}" "${STOKER_DEPS[@]}"
fi
cd "$ROOT"
PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" benchmarks/torchdata_suite.py "$@"
