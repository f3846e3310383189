"""``benchmarks/bench_stream_bucketing.py``: one tiny run, and the padding it must report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_stream_bucketing.py"


def test_tiny_run_reports_less_padding_for_both_ways_of_bucketing() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, str(SCRIPT), "--samples", "3000", "--batch-size", "8"]
    command += ["--window", "256"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("3,000 samples, lognormal(mu=5.5, sigma=0.9) lengths clipped")
    assert lines[0].endswith("batch_size=8, window=256")
    ratios = {}
    for name in (
        "plain batching",
        "BucketStream, sorted windows",
        "BucketStream, boundaries 16..4096",
    ):
        (line,) = [line for line in lines if line.startswith(name)]
        ratios[name] = float(line[36:].split()[2])  # padding tokens, share, vs plain, us/sample
    assert ratios["plain batching"] == 1.0
    assert ratios["BucketStream, sorted windows"] < 0.3
    assert ratios["BucketStream, boundaries 16..4096"] < 0.5
