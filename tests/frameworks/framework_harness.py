"""Helpers for the framework tests: the environment of a job, and running one under torchrun.

Multi-process jobs run under a real ``torchrun`` (gloo on CPU, every address on
127.0.0.1); the assertions run in the test process on the JSON each rank writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_TIMEOUT_S = 300


def framework_env() -> dict[str, str]:
    """The environment of a job: stoker importable, one thread per process, loopback only."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["MASTER_ADDR"] = "127.0.0.1"
    env["GLOO_SOCKET_IFNAME"] = "lo"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    return env


def run_ranks(script: Path, out_dir: Path, *args: str, nproc: int = 2) -> list[dict]:
    """Runs ``script OUT_DIR *args`` on ``nproc`` ranks under torchrun; returns each rank's JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", "--standalone", str(script), str(out_dir), *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=framework_env(), capture_output=True, text=True, timeout=_TIMEOUT_S
    )
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-8000:]}"
    return [
        json.loads((out_dir / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(nproc)
    ]
