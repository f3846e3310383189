"""``benchmarks/bench_object_storage.py``: one tiny run against the local S3 server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_object_storage.py"


def test_tiny_run_prints_every_figure_and_resumes_without_refetching() -> None:
    pytest.importorskip("s3fs", reason="needs the storage extra (pip install 'stoker[storage]')")
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    command = [sys.executable, str(SCRIPT), "--shards", "4", "--shard-mib", "1", "--rounds", "1"]
    command += ["--step-ms", "0", "--latency-ms", "1", "--prefetch", "1", "--ranged"]
    command += ["--records", "3"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "4 shards x 1 MiB, 0 ms step per batch of 32 x 64 KiB, +1 ms per request" in out
    for label in ("local disk", "s3, cold cache", "s3, 2nd epoch"):
        assert re.search(rf"  {re.escape(label)} +\d+\.\d{{3}} s", out), label
    # the resumed epoch fetched none of the 3 consumed shards and the last one once
    assert "GETs of consumed shards 0, GETs per shard [0, 0, 0, 1]" in out
    assert re.search(r"3 random records over [1-3] shards: ranged GETs \d+\.\d+ s, whole", out)
