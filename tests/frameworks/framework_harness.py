"""Helpers for the framework tests: the environment of a job, and running one under torchrun.

Multi-process jobs run under a real ``torchrun`` (gloo on CPU, every address on
127.0.0.1); the assertions run in the test process on the JSON each rank writes. A job
that does not finish in time fails with every one of its processes' Python stacks
(faulthandler, woken by SIGABRT), never with a bare timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.children import fault_env, finish

_TIMEOUT_S = 120


def framework_env() -> dict[str, str]:
    """The environment of a job: stoker importable, one thread per process, loopback only."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["MASTER_ADDR"] = "127.0.0.1"
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (see run_job)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    return env


def run_job(
    command: list[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = _TIMEOUT_S
) -> str:
    """Runs ``command``; returns its stdout, or fails with what it printed and its stacks.

    On a timeout every process of the job is sent SIGABRT first, so that faulthandler
    (``PYTHONFAULTHANDLER=1``) writes each one's Python stacks to the captured stderr,
    then SIGKILL; nothing of the job outlives the call.
    """
    env = fault_env(env)
    with subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as job:
        out, err = finish(job, timeout, f"{' '.join(command[:6])} ...")
    if job.returncode != 0:
        pytest.fail(f"the job exited with {job.returncode}:\n{out[-3000:]}\n{err[-8000:]}")
    return out


def run_ranks(script: Path, out_dir: Path, *args: str, nproc: int = 2) -> list[dict]:
    """Runs ``script OUT_DIR *args`` on ``nproc`` ranks under torchrun; returns each rank's JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", "--standalone", str(script), str(out_dir), *args,
    ]  # fmt: skip
    run_job(command, framework_env())
    return [
        json.loads((out_dir / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(nproc)
    ]
