"""Child processes a test starts: waiting for them without ever hanging blind.

:func:`finish` waits for a child; one that does not exit in time is sent SIGABRT, with
every process below it, so that faulthandler (``PYTHONFAULTHANDLER=1`` in the child's
environment, see :func:`fault_env`) writes each one's Python stacks to its stderr, and is
then killed. The test fails with those stacks instead of a bare timeout, and nothing of
the child outlives the call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import AnyStr

import pytest

from stoker._proc import descendants

__all__ = ["fault_env", "finish", "with_default_signals"]

_DUMP_WAIT_S = 2.0  # time for faulthandler to write the stacks before the kill
_DUMP_GAP_S = 0.3  # between two processes' dumps, so that their stacks do not interleave
_STDERR_KEPT = 60_000  # characters of the child's stderr a failure shows (its end)


def fault_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with faulthandler on, so SIGABRT dumps stacks."""
    return {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}


# Execs the rest of argv with Ctrl-C as a user's shell gives it: SIGINT neither ignored nor
# blocked, whatever this test process inherited or did to its own signal state.
_DEFAULT_SIGNALS = (
    "import os, signal, sys; "
    "signal.pthread_sigmask(signal.SIG_SETMASK, []); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def with_default_signals(command: list[str]) -> list[str]:
    """``command``, started with SIGINT at its default (tests that press Ctrl-C use it)."""
    return [sys.executable, "-c", _DEFAULT_SIGNALS, *command]


def finish(proc: subprocess.Popen[AnyStr], timeout: float, what: str = "") -> tuple[AnyStr, AnyStr]:
    """``proc.communicate(timeout=timeout)``, or a failure with every process's stacks."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [proc.pid, *descendants(proc.pid)]
        # the deepest first (workers before the process waiting on them), one at a time
        for pid in reversed(tree):
            _signal_all([pid], signal.SIGABRT)
            time.sleep(_DUMP_GAP_S)
        time.sleep(_DUMP_WAIT_S)
        _signal_all([*tree, *descendants(proc.pid)], signal.SIGKILL)
        out, err = proc.communicate()
        text = [s.decode(errors="replace") if isinstance(s, bytes) else s for s in (out, err)]
        pytest.fail(
            f"{what or proc.args!r} did not finish in {timeout:.0f} s; its processes {tree} "
            f"were sent SIGABRT for their stacks, then killed.\n"
            f"stdout:\n{text[0][-3000:]}\nstderr:\n{without_module_lists(text[1])[-_STDERR_KEPT:]}"
        )


def without_module_lists(text: str) -> str:
    """``text`` less faulthandler's lists of loaded extension modules (kilobytes per process)."""
    return "\n".join(line for line in text.splitlines() if "Extension modules:" not in line)


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
