"""``benchmarks/bench_shuffle_quality.py``: one tiny run, and the figures it must print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_shuffle_quality.py"


def rows(out: str, first: str) -> list[list[str]]:
    """The cells of the table rows that start with ``| first``."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith(f"| {first}")
    ]


def test_tiny_run_prints_both_tables_with_the_figures_of_each_order() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, str(SCRIPT), "--files", "4", "--per-file", "50"]
    command += ["--buffers", "10,200", "--shard-sizes", "10,100", "--shard-buffers", "20"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "200 records in 4 files of 50" in out
    # files in order, no buffer: the files' own order
    assert rows(out, "False | -") == [["False", "-", "+1.000", "0", "100.0%"]]
    assert len(rows(out, "False")) == 3 and len(rows(out, "True")) == 3
    # a buffer holding every record breaks every neighbour pair
    assert rows(out, "False | 200")[0][4] == "0.0%"
    assert "200 records, shuffle_files=True, across shard sizes" in out
    small, large = rows(out, "10 | 20 |"), rows(out, "100 | 2 |")
    assert [r[2] for r in small] == ["-", "20", "(a full permutation)"]
    assert [r[2] for r in large] == ["-", "20", "(a full permutation)"]
    # two files of 100 read in a shuffled order: each 100 records come from one file
    assert large[0][3:] == ["+1.000", "0", "100.0%", "1.0"]
    # twenty files of 10: every 100 consecutive records span ten of them, a full shuffle all
    assert small[0][6] == "10.0" and small[2][6] == "20.0"
    assert float(small[1][6]) > 10.0  # a buffer of two files mixes across file edges
