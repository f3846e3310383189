"""A check that a command left no worker process or stoker shared-memory segment behind."""

from __future__ import annotations

import glob
import os
import time

from stoker._proc import descendants

__all__ = ["assert_nothing_left_behind"]


def assert_nothing_left_behind(what: str, *, wait_s: float = 5.0) -> None:
    """Fails when ``what`` left a child process (multiprocessing's own helpers aside) or a
    ``/dev/shm/stoker-<this pid>-*`` segment; waits up to ``wait_s`` for workers to exit."""
    deadline = time.monotonic() + wait_s
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not descendants(os.getpid()), f"{what} left worker processes behind"
    assert not glob.glob(f"/dev/shm/stoker-{os.getpid()}-*"), f"{what} left shared-memory segments behind"
