"""The trainer itself goes away: Ctrl-C, interpreter exit, SIGKILL. Run as real child scripts."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import stoker
from engine.engine_datasets import Samples
from harness import leaks as engine_harness
from harness.children import fault_env, finish, with_default_signals
from stoker import DataLoader
from stoker.engine import slots

_EXIT_WITHIN_S = 30.0
_LINE_WITHIN_S = 30.0

# A slow dataset of 160 KiB samples: batches of 2 use the shared-memory slots.
_PRELUDE = """
import multiprocessing
import os
import sys
import time

import numpy as np

from stoker import DataLoader


class Slow:
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.02)
        return np.full(20_000, i, np.float64)
"""


def start_script(tmp_path: Path, body: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "trainer.py"
    main = textwrap.indent(textwrap.dedent(body), "    ")
    script.write_text(f"{_PRELUDE}\n\nif __name__ == '__main__':\n{main}")
    env = fault_env()  # a child that does not exit in time is shown with its stacks
    src = str(Path(stoker.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        with_default_signals([sys.executable, str(script)]),  # Ctrl-C as from a shell
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )


def read_line(proc: subprocess.Popen[bytes], limit_s: float = _LINE_WITHIN_S) -> str:
    """The child's next stdout line, without ever blocking past ``limit_s``."""
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + limit_s
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the child printed no line within {limit_s} s; stderr:\n{err.decode()}")
        chunk = os.read(fd, 1)
        if not chunk:
            _, err = proc.communicate()
            pytest.fail(
                f"the child exited with {proc.returncode} before printing; stderr:\n{err.decode()}"
            )
        data += chunk
    return data.decode().strip()


def assert_child_left_nothing(child_pid: int, workers: list[engine_harness.Proc]) -> None:
    assert engine_harness.wait_gone(workers) == [], "a worker of the child outlived it"
    assert engine_harness.shm_segments(child_pid) == []
    assert engine_harness.stack_files(child_pid) == []


def test_ctrl_c_in_the_trainer_stops_workers_and_frees_shared_memory(tmp_path) -> None:
    proc = start_script(
        tmp_path,
        """
        loader = DataLoader(Slow(), batch_size=2, num_workers=2)
        for n, batch in enumerate(loader):
            if n == 3:
                print("started", flush=True)
        """,
    )
    assert read_line(proc) == "started"
    workers = engine_harness.descendants(proc.pid)
    assert len(workers) == 2  # the two workers, and nothing else
    assert (
        engine_harness.shm_segments(proc.pid) != []
    )  # the slot pool exists: the check below means something
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc, _EXIT_WITHIN_S)
    text = err.decode()
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in text and "KeyboardInterrupt" in text
    assert_child_left_nothing(proc.pid, workers)


@pytest.mark.parametrize(
    "options",
    [
        "worker_mode='process'",
        "worker_mode='thread'",
        "worker_mode='process', persistent_workers=True",
    ],
    ids=["process", "thread", "persistent"],
)
def test_interpreter_exit_with_a_live_iterator_is_prompt_and_clean(options: str, tmp_path) -> None:
    started = time.monotonic()
    proc = start_script(
        tmp_path,
        f"""
        loader = DataLoader(Slow(), batch_size=2, num_workers=2, {options})
        it = iter(loader)
        batch = next(it)
        batch = next(it)
        assert batch.shape == (2, 20_000) and batch[:, 0].tolist() == [2.0, 3.0]
        print("started", flush=True)
        # ends here: the workers are busy loading the next batches
        """,
    )
    assert read_line(proc) == "started"
    workers = engine_harness.descendants(proc.pid)
    assert len(workers) == (0 if "thread" in options else 2)
    _, err = finish(proc, _EXIT_WITHIN_S)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err.decode()
    assert err.decode() == ""  # no traceback, no warning from a half-torn-down pool
    assert elapsed < _EXIT_WITHIN_S
    assert_child_left_nothing(proc.pid, workers)


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_sigkilled_trainer_takes_its_workers_along_and_its_segments_are_swept(
    context: str, tmp_path
) -> None:
    proc = start_script(
        tmp_path,
        f"""
        context = {context!r}
        loader = DataLoader(Slow(), batch_size=2, num_workers=2, multiprocessing_context=context)
        kept = []
        for n, batch in enumerate(loader):
            kept.append(batch)  # hold the slots, so segments exist when the kill comes
            if n == 3:
                print("started", flush=True)
        """,
    )
    assert read_line(proc) == "started"
    workers = engine_harness.descendants(proc.pid)
    # forkserver: the server (the workers' parent) and multiprocessing's resource tracker too
    assert len(workers) == (2 if context == "fork" else 4)
    assert engine_harness.shm_segments(proc.pid) != []
    assert len(engine_harness.stack_files(proc.pid)) == 2  # one per worker
    proc.kill()
    finish(proc, _EXIT_WITHIN_S)
    assert proc.returncode == -signal.SIGKILL
    # PR_SET_PDEATHSIG: the kernel kills the workers the moment their parent dies
    assert engine_harness.wait_gone(workers) == [], "a process outlived its SIGKILLed trainer"
    # nobody could unlink the dead trainer's segments; the next slot pool does
    pool = slots.SlotPool(count=1, size=4096)
    pool.close()
    assert engine_harness.shm_segments(proc.pid) == []
    # and the next process pool removes its stack-dump files from the temp directory
    assert len(list(DataLoader(Samples(4), batch_size=2, num_workers=1))) == 2
    assert engine_harness.stack_files(proc.pid) == []


@pytest.mark.parametrize("handler", ["none", "user"])
def test_sigterm_to_the_trainer_stops_workers_and_frees_everything(handler: str, tmp_path) -> None:
    """How schedulers end a job. The default action still ends the trainer with SIGTERM's
    status; a handler of the user's, installed before, still decides (here: exit 7)."""
    install = (
        "import signal; signal.signal(signal.SIGTERM, lambda s, f: sys.exit(7))"
        if handler == "user"
        else ""
    )
    proc = start_script(
        tmp_path,
        f"""
        {install}
        loader = DataLoader(Slow(), batch_size=2, num_workers=2)
        kept = []
        for n, batch in enumerate(loader):
            kept.append(batch)  # hold the slots, so segments exist when the signal comes
            if n == 3:
                print("started", flush=True)
        """,
    )
    assert read_line(proc) == "started"
    workers = engine_harness.descendants(proc.pid)
    assert len(workers) == 2
    assert (
        engine_harness.shm_segments(proc.pid) != []
        and len(engine_harness.stack_files(proc.pid)) == 2
    )
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc, _EXIT_WITHIN_S)
    assert proc.returncode == (7 if handler == "user" else -signal.SIGTERM), err.decode()
    assert_child_left_nothing(proc.pid, workers)  # no segment, no stack file, no worker left
