"""``benchmarks/bench_stream_state.py``: one tiny run, and the table it must print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_stream_state.py"


def test_tiny_run_prints_a_row_for_0_and_2_workers() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, str(SCRIPT), "--samples", "400", "--sample-kb", "8"]
    command += ["--buffer", "16", "--batch", "8"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "400 samples of 8 KB (3 MiB), ShuffleBuffer(16), batch_size=8"
    assert lines[1].split() == [
        "workers", "samples/s", "trainer", "MiB", "worker", "MiB", "state_dict", "ms", "state",
        "MiB",
    ]  # fmt: skip
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["0", "2"]
    assert all(float(row[-1]) > 0 for row in rows)  # a state holds each buffer's samples
