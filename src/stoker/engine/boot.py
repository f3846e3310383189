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

import time
from dataclasses import dataclass

from stoker._errors import WorkerError
from stoker.engine.messages import Initialised, Ready, StartEpoch, StartupFailed, rebuild_error
from stoker.engine.pool import Pool

__all__ = ["Booted", "boot"]

_POLL_S = 1.0


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
    timeout then names the stuck worker, with its stack. A worker's error in
    ``worker_init_fn``, or a worker that dies starting, stops the pool and is raised.
    """
    start = StartEpoch(epoch=epoch, seed=seed, boot=True)
    for worker_id in range(pool.num_workers):
        if pool.is_started(worker_id):
            pool.send(worker_id, start)
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    try:
        while not all(w in pool.initialised for w in range(pool.num_workers) if pool.is_started(w)):
            wait = _POLL_S
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return
            messages, deaths = pool.poll(wait)
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
            for death in deaths:
                if death.worker_id not in pool.initialised:
                    raise WorkerError(f"DataLoader {death.describe(starting=True)}")
    except BaseException:
        pool.shutdown()
        raise
