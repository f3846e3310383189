"""``benchmarks/bench_packed.py --verify``: one tiny run of the cost-of-verification table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_packed.py"


def test_verify_run_prints_a_row_per_mode_and_cleans_up(tmp_path) -> None:
    pytest.importorskip("PIL")
    scratch = tmp_path / "tmp"  # the script's images and packed copy go here, and must go
    scratch.mkdir()
    out_json = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(scratch)}
    command = [sys.executable, str(SCRIPT), "--verify", "--count", "48", "--sizes", "32"]
    command += ["--crop", "16", "--rounds", "1", "--workers", "1", "--batch-size", "16"]
    command += ["--block-size", "16", "--json", str(out_json)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "PackedDataset(verify=...), 48 records; median of 1 rounds" in out
    assert "| verify | open (ms) | ratio | bare fetch (us/record) |" in out
    for mode in ("False", "'read'", "'open'"):
        assert f"round 1/1 verify={mode:7}: open " in out
        assert f"\n| {mode} | " in out
    assert "| False | " in out and "| 1.00x [1.00-1.00] |" in out  # the baseline against itself
    assert "48 JPEGs in 1 shards" in out
    saved = json.loads(out_json.read_text())
    for mode in ("False", "read", "open"):
        assert len(saved["rounds"][mode]["epoch_batches_s"]) == 1
        assert saved[mode]["open_ms"]["median"] > 0
    assert saved["setup"]["count"] == 48
    assert list(scratch.iterdir()) == []
