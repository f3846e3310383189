"""SIGTERM: stop the process pools, then let the signal do what it would have done.

SIGTERM is how Slurm, Kubernetes and ``docker stop`` end a job. Python's default action
for it ends the process at once, without ``finally`` blocks, ``atexit`` or
``weakref.finalize``, so a trainer's worker pools would leave their shared-memory
segments and stack-dump files behind until some later stoker pool on the machine swept
them, and workers would linger until their parent check noticed.

When the first process pool of a trainer starts (in the main thread: Python only lets
the main thread install handlers), stoker installs a SIGTERM handler that shuts every
live pool down (NOTE [ Shutdown ] in :mod:`stoker.engine.pool`) and then hands the signal
on, unchanged:

* to the handler that was installed before, if it was a Python function (the user's own
  handler keeps deciding what happens: exit status, a checkpoint, carrying on);
* nowhere, if SIGTERM was ignored;
* otherwise to the default action: the handler restores it and sends SIGTERM again, so
  the process still ends "killed by SIGTERM" (status -15, or 143 in a shell), which is
  what schedulers look for.

A handler the user installs *after* stoker's replaces it; stoker's pools are then cleaned
up when that handler ends the process through ``sys.exit`` (the finalizers run at exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from typing import Any

__all__ = ["register"]

_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_previous: Any = None
_installed_in: int | None = None  # the pid that installed the handler (a fork inherits it)


def register(pool: Any) -> None:
    """Has SIGTERM shut ``pool`` down (installs the handler once per process, if it can)."""
    _pools.add(pool)
    _install()


def _install() -> None:
    global _previous, _installed_in
    if _installed_in == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _installed_in == os.getpid():
            return
        try:
            current = signal.getsignal(signal.SIGTERM)
            if current is _on_sigterm:  # installed by the process this one was forked from
                current = _previous
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not the main thread of the main interpreter
            return
        _previous = current
        _installed_in = os.getpid()


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() == _installed_in:
        for pool in list(_pools):
            with contextlib.suppress(Exception):
                pool.shutdown()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
