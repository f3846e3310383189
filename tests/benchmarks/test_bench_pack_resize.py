"""``benchmarks/bench_pack_resize.py``: one quick run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_pack_resize.py"


def test_quick_run_prints_both_packed_copies_and_the_ratios(tmp_path) -> None:
    pytest.importorskip("PIL", reason="the photos are written and resized with Pillow")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [
        sys.executable, str(SCRIPT), "--images", "6", "--rounds", "2",
        "--data", str(tmp_path / "data"),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "6 JPEGs of 1600x1200, 10 classes, 6 records per packed copy" in out
    assert "| `plain` | " in out and "| `--max-side 500 --quality 90` | " in out
    match = re.search(r"size on disk, plain / resized: ([\d.]+)x", out)
    assert match and float(match.group(1)) > 3  # 1600x1200 -> 500x375 at the same quality
    assert "re-encoded 6 image(s)" in out
