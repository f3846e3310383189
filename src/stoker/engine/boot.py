"""Starting an epoch's workers in ``iter(loader)``, before its first ``next()``, as torch does.

torch's ``iter(loader)`` starts its worker processes, so a failing ``worker_init_fn``
raises there and the workers are warm by the first ``next()``. stoker decides the epoch
(its number, its seed, the sampler's order) only at the first ``next()``, so a
``set_epoch`` between ``iter()`` and ``next()`` still counts. :func:`boot` bridges the two:
``iter()`` starts the pool and sends each worker a :class:`StartEpoch` with ``boot=True``
carrying the epoch and seed the loader expects (worked out without drawing from any
generator); the worker seeds itself and runs ``worker_init_fn``, and :func:`boot` waits
until every started worker has done so, raising the first one's error. The epoch's own
StartEpoch follows at the first ``next()``: the same epoch and seed, and the worker only
takes its stream state; another epoch or seed (the user called ``set_epoch`` or drew from
the generator in between), and the loader starts fresh workers, since ``worker_init_fn``
saw the wrong seed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from stoker._errors import WorkerError
from stoker.engine.messages import Initialised, Ready, StartEpoch, StartupFailed, rebuild_error
from stoker.engine.pool import Pool

__all__ = ["Booted", "boot"]

_POLL_S = 1.0
# With no timeout a worker that has not started after this long is reported once (with
# its stack) and still waited for: a slow worker_init_fn is legitimate, a silent hang is not.
STARTUP_REPORT_S = 60.0

_log = logging.getLogger("stoker")


@dataclass(frozen=True, slots=True)
class Booted:
    """A pool ``iter()`` started, and the epoch and seed its workers were started with."""

    pool: Pool
    epoch: int | None  # None: not known without a draw; the workers wait for the epoch's start
    seed: int | None

    def fits(self, epoch: int, seed: int) -> bool:
        """Whether the epoch that starts is the one the workers were started for."""
        return self.epoch is None or (self.epoch, self.seed) == (epoch, seed)


def boot(pool: Pool, epoch: int, seed: int, timeout_s: float) -> None:
    """Starts the epoch's workers' first epoch and waits until each ran ``worker_init_fn``.

    A worker held back by the staggered start is started once worker 0 is ready (as the
    epoch would), unless forked workers ramp up one at a time while batches flow. Gives
    up waiting, without an error, after ``timeout_s`` (when positive): the epoch's own
    timeout then names the stuck worker, with its stack. With no timeout, a worker not
    started after ``STARTUP_REPORT_S`` is logged once, with its stack, and still waited
    for. A worker's error in
    ``worker_init_fn``, or a worker that dies starting, stops the pool and is raised.
    """
    start = StartEpoch(epoch=epoch, seed=seed, boot=True)
    for worker_id in range(pool.num_workers):
        if pool.is_started(worker_id):
            pool.send(worker_id, start)
    began = time.monotonic()
    deadline = began + timeout_s if timeout_s > 0 else None
    reported = False
    try:
        while not all(w in pool.initialised for w in range(pool.num_workers) if pool.is_started(w)):
            wait = _POLL_S
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return
            elif not reported and time.monotonic() - began >= STARTUP_REPORT_S:
                reported = True
                _report_slow_start(pool, time.monotonic() - began)
            messages, deaths = pool.poll(wait)
            _take(pool, messages, start)
            for death in deaths:
                if death.worker_id not in pool.initialised:
                    raise WorkerError(f"DataLoader {death.describe(starting=True)}")
    except BaseException:
        pool.shutdown()
        raise


def _take(pool: Pool, messages: list, start: StartEpoch) -> None:
    """Records the workers that are ready or initialised; raises a worker's startup error."""
    for worker_id, message, _leased in messages:
        if isinstance(message, Ready):
            pool.pids[worker_id] = message.pid
            if not pool.ramp:
                for started in pool.start_deferred():
                    pool.send(started, start)
        elif isinstance(message, Initialised):
            pool.initialised.add(worker_id)
        elif isinstance(message, StartupFailed):
            raise rebuild_error(
                message.failure, worker_id,
                "in worker_init_fn or while starting the worker", pool.pid(worker_id),
            )  # fmt: skip


def _report_slow_start(pool: Pool, waited_s: float) -> None:
    """Logs each started worker that is not past ``worker_init_fn`` yet, with its stack."""
    for worker_id in range(pool.num_workers):
        if not pool.is_started(worker_id) or worker_id in pool.initialised:
            continue
        try:
            stack = pool.dump_stack(worker_id)
        except Exception as exc:  # the report is a courtesy; the wait goes on
            stack = f"(no stack: {type(exc).__name__}: {exc})"
        pid = pool.pid(worker_id)
        who = f"pid {pid}" if pid is not None else "not started yet"
        _log.warning(
            "DataLoader worker %d (%s) has not finished starting after %.0f s (stoker goes on "
            "waiting; a worker_init_fn may be slow, or the worker is stuck; pass timeout= to "
            "make this an error). Its stack:\n%s",
            worker_id, who, waited_s, stack,
        )  # fmt: skip
