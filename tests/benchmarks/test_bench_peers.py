"""``benchmarks/bench_peers.py``: one quick run in stoker's own environment, and its checks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_peers.py"


def _load_bench_peers():
    """The script as a module (its dataclasses need it in sys.modules while it runs)."""
    name = "bench_peers_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_quick_run_prints_the_table_checks_every_sample_and_names_missing_peers(tmp_path) -> None:
    pytest.importorskip("torch")
    # A stand-in "grain" that fails to import, so the row is unavailable wherever this runs.
    (tmp_path / "grain").mkdir()
    (tmp_path / "grain" / "__init__.py").write_text(
        "raise ImportError('hidden by the test', name='grain')\n"
    )
    out_json = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    command = [sys.executable, str(SCRIPT), "--quick", "--no-ttfb", "--workloads", "tiny,large"]
    command += ["--loaders", "torch,stoker-process,stoker-thread,grain", "--json", str(out_json)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "| loader | tiny | large |" in out
    for name in ("torch", "stoker-process", "stoker-thread"):
        assert f"| {name} | " in out
        assert f"{name} (4 epochs)" in out  # 2 rounds x 2 workloads, each counted
    assert "Where the time goes on large" in out
    assert "Exactly once: every sample arrived exactly once" in out
    assert "unavailable: grain: grain is not installed here" in out
    assert "| grain | " not in out
    assert "share of the copy-bound limit" in out  # the large arrays against the copy bandwidth
    saved = json.loads(out_json.read_text())
    assert saved["unavailable"] == {"grain": "grain is not installed here"}
    assert len(saved["workloads"]["tiny"]["rates"]["stoker-thread"]) == 2
    bandwidth = saved["workloads"]["large"]["bandwidth"]
    assert min(bandwidth[k] for k in ("copyto_one", "stack_all", "turns_all")) > 1e8  # 100 MB/s
    assert "share of the memory-bound limit" in out


def test_exactly_once_check_rejects_a_repeated_or_missing_sample() -> None:
    bench = _load_bench_peers()
    bench.check_exactly_once("ok", [np.array([2, 0]), np.array([3, 1])], 4)
    with pytest.raises(bench.NotExactlyOnce, match=r"1 missing, 1 delivered more than once"):
        bench.check_exactly_once("twice", [np.array([0, 1]), np.array([1, 3])], 4)
    with pytest.raises(bench.NotExactlyOnce, match=r"1 out of range"):
        bench.check_exactly_once("beyond", [np.array([0, 1, 2, 3, 4])], 4)


def test_rounds_rotate_the_order_of_the_loaders() -> None:
    bench = _load_bench_peers()
    names = ["a", "b", "c"]
    assert [bench.rotated(names, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
