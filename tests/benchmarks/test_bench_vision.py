"""``benchmarks/bench_vision.py``: one quick run in stoker's own environment (no DALI here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_vision.py"


def test_quick_run_times_every_loader_checks_batches_and_names_missing_peers(tmp_path) -> None:
    pytest.importorskip("torch", reason="the torch row needs torch (CI installs it)")
    # A stand-in "nvidia" package whose dali fails to import: the DALI row is unavailable
    # wherever this runs, and the run goes on without it.
    (tmp_path / "stub" / "nvidia" / "dali").mkdir(parents=True)
    (tmp_path / "stub" / "nvidia" / "__init__.py").write_text("")
    (tmp_path / "stub" / "nvidia" / "dali" / "__init__.py").write_text(
        "raise ImportError('hidden by the test', name='nvidia.dali')\n"
    )
    out_json = tmp_path / "out.json"
    paths = [str(tmp_path / "stub"), str(ROOT / "src")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [
        sys.executable, str(SCRIPT), "--sizes", "small", "--images", "40", "--rounds", "2",
        "--batches", "1", "--cost-samples", "4", "--data", str(tmp_path / "data"),
        "--loaders", "stoker,stoker-process,stoker-packed,torch,dali", "--json", str(out_json),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "small: 40 JPEGs of 500x375, 10 classes" in out
    for name in ("stoker", "stoker-process", "stoker-packed", "torch"):
        assert f"| {name} | " in out, out
    assert "| dali | " not in out
    assert "dali: nvidia.dali is not installed here" in out, out
    assert "stoker-process: ran process workers" in out
    assert "| whole recipe: ImageFolder[i] |" in out  # the per-sample cost table
    saved = json.loads(out_json.read_text())
    rounds = saved["sizes"]["small"]
    assert saved["unavailable"] == {"dali": "nvidia.dali is not installed here"}
    assert json.dumps(rounds).count("first_s") >= 8  # 2 rounds x 4 loaders, each timed
