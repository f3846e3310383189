"""The trainer's side of multi-worker loading: one epoch of scheduling and delivery.

The main process owns the sampler. It keeps up to ``prefetch_factor`` tasks in flight
per worker (map-style datasets: one of the epoch's first tasks to each worker, then to the
least-loaded worker; iterable datasets: in strict rotation, as torch does, so the stream
order is torch's; with ``in_order=False`` a busy worker's turn passes to the next; a thread
pool's first task goes out alone, see :mod:`stoker.engine.head_start`), and delivers
batches in task order (``in_order=True``) or as they arrive (``in_order=False``; still
bounded by the tasks in flight and by ``memory_budget``). Every batch-sized array
travels through a shared-memory slot (:mod:`stoker.engine.slots`) once the first batches
have shown how big a batch is; until then through one-off segments, and small batches
travel inline.

It works from an :class:`~stoker.engine.plan.EpochPlan` and reports back through
:class:`~stoker.engine.plan.EpochHooks`; it never sees the loader. It is also what the
autotuner drives (:class:`~stoker.engine.autotune.Tunable`: ``workers``, ``prefetch``,
``batch_bytes``, ``worker_idle_s``, ``add_worker()``, ``set_prefetch()``).
"""

from __future__ import annotations

import functools
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._errors import ShmError, WorkerError
from stoker._resume import Progress
from stoker._skipped import SKIPPED
from stoker._tree import map_leaves
from stoker.engine import segments, slots, transport
from stoker.engine.autotune import AutoTuner
from stoker.engine.fetch import summary
from stoker.engine.head_start import HeadStart
from stoker.engine.messages import (
    Done,
    Exhausted,
    Failed,
    Initialised,
    Ready,
    StartEpoch,
    StartupFailed,
    Task,
    Undelivered,
    add_note,
    rebuild_error,
)
from stoker.engine.mode_trial import ModeTrial
from stoker.engine.plan import EpochHooks, EpochPlan
from stoker.engine.pool import Pending, Pool, PoolState, WorkerDeath
from stoker.engine.stream_state import ask_workers
from stoker.profiling.stats import StatsRecorder

__all__ = ["MultiWorkerIterator", "next_epoch_streams"]

_POLL_S = 1.0  # a dead thread worker is noticed within this; process deaths wake us at once
_MAX_RESTARTS_PER_TASK = 3
_CLOSING_NOTE = (
    "stoker: raised when the epoch's iterator closed before its end and asked its workers where "
    "their streams stood, for a later state_dict()"
)
_ENDING_NOTE = (
    "stoker: raised when the epoch ended and asked its workers where their streams stood before "
    "the batches a pinning thread held, for a later state_dict()"
)


@dataclass(frozen=True, slots=True)
class _Raise:
    error: BaseException


@dataclass(frozen=True, slots=True)
class _Accounted:
    """A batch with its bad-sample accounting, settled when it is delivered."""

    batch: Any
    attempted: int
    skipped: tuple[Any, ...]
    empty: bool


class MultiWorkerIterator:
    """Iterates one epoch of batches produced by a :class:`~stoker.engine.pool.Pool`.

    Args:
        plan: how to run the epoch.
        hooks: what it calls back (delivery, bad-sample accounting, tuning changes).
        pool: the workers; ``owns_pool``: shut them down when the epoch ends.
        progress: where the epoch stands (shared with the loader for ``state_dict``).
        index_iter: the epoch's index batches from the first one to load (map-style).
        first_position: the place in the epoch of that batch's first sample.
        stats: where stage times go (``loader.stats()``).
        autotuner: grows workers and prefetch while running (``"auto"``), or None.
        mode_trial: measures threads against processes (``worker_mode="auto"``), or None.
    """

    def __init__(
        self,
        plan: EpochPlan,
        hooks: EpochHooks,
        pool: Pool,
        *,
        owns_pool: bool,
        progress: Progress,
        index_iter: Iterator[Any] | None,
        first_position: int,
        stats: StatsRecorder,
        autotuner: AutoTuner | None,
        mode_trial: ModeTrial | None = None,
    ) -> None:
        self._plan = plan
        self._hooks = hooks
        self._deliver = hooks.deliver
        self._pool = pool
        self._owns_pool = owns_pool
        self._iterable = plan.iterable
        self._in_order = plan.in_order
        self._timeout = plan.timeout_s
        self._restart = plan.restart_dead_workers
        self._copy = plan.copy_batches
        self._per_worker = plan.prefetch_factor
        self._progress = progress
        self._epoch = progress.epoch
        self._seed = progress.seed
        self._index_iter = index_iter
        self._batch_index = progress.floor  # the next task's place in the epoch
        self._position = first_position  # the next task's first sample's place in the epoch
        self._auto_collation = plan.auto_collation
        self._record_bad_samples = hooks.record_bad_samples
        self._recorder = stats
        self._autotune = autotuner
        self._trial = mode_trial if hooks.replace_pool is not None else None
        self._switch_to: str | None = None  # worker_mode="auto": the kind to swap to, once drained
        self._epoch_batches = plan.batches
        self._memory_budget = plan.memory_budget
        self._first_task = self._next_yield = pool.ledger.next_task
        self._ready: dict[int, Any] = {}
        self._places: dict[int, int] = {}  # task id -> the batch's place in the epoch
        self._in_flight = 0  # this epoch's tasks sent and not yet answered
        self._rotation = progress.next_worker  # a resumed stream goes on with the next worker
        # an iterable dataset: each worker's tasks sent this epoch, and each task's worker and
        # place among them (what a state asks that worker for: see stoker.engine.stream_state)
        self._sent: list[int] = []
        self._stream_tasks: dict[int, tuple[int, int]] = {}
        self._take_backs = plan.take_backs
        self._sources_done = False
        self._closed = False  # close() was called (from any thread): next() stops at once
        self._finalizer: weakref.finalize | None = None
        # a thread pool's first task goes out alone (stoker.engine.head_start): due until
        # it is sent, then the HeadStart that says when the others follow
        self._head_start_due = False
        self._head_start: HeadStart | None = None
        if self._trial is not None:
            self._trial.restart_window()
        self._use_pool(pool)

    def _use_pool(self, pool: Pool) -> None:
        """Takes ``pool`` as this epoch's workers: tells them the epoch, gives them work."""
        self._pool = pool
        ledger = pool.ledger
        ledger.generation += 1
        self._ledger = ledger
        self._generation = ledger.generation
        self._active = [True] * pool.num_workers
        # map-style: workers not given a task yet this epoch; the first tasks go one to
        # each, as torch's round-robin sends them (a dataset whose workers meet at a
        # barrier relies on it), even when a worker answers before the others start
        self._unserved = set(range(pool.num_workers))
        self._recent_slots: list[list[int]] = [[] for _ in range(pool.num_workers)]
        self._head_start_due = pool.mode == "thread" and pool.num_workers > 1
        self._sent = [0] * pool.num_workers
        if self._owns_pool or self._iterable:
            self._finalizer = weakref.finalize(
                self, _end_epoch, pool, self._progress if self._iterable else None,
                self._generation, self._owns_pool,
            )  # fmt: skip
        for worker_id in range(pool.num_workers):
            if pool.is_started(worker_id):
                pool.send(worker_id, self._start_epoch(worker_id))
        self._dispatch()

    def _swap_pool(self) -> None:
        """worker_mode="auto": every task of the old pool answered, the new kind takes over."""
        kind, self._switch_to = self._switch_to, None
        assert kind is not None and self._hooks.replace_pool is not None
        if self._finalizer is not None:
            self._finalizer()  # the old pool, owned by this epoch: stopped
        next_task = self._ledger.next_task
        pool = self._hooks.replace_pool(kind)  # a persistent old pool is stopped by the loader
        pool.ledger.next_task = max(pool.ledger.next_task, next_task)
        self._recorder.stats.num_workers = pool.num_workers
        if self._trial is not None:
            self._trial.switched(kind)
        self._use_pool(pool)

    def _start_deferred(self, limit: int | None = None) -> None:
        """Starts workers the staggered start held back, tells them the epoch, gives them work."""
        try:
            started = self._pool.start_deferred(limit)
        except BaseException:
            self._close_broken()
            raise
        for worker_id in started:
            self._pool.send(worker_id, self._start_epoch(worker_id))
        if started:
            self._dispatch()

    def start_all_workers(self) -> None:
        """Starts every worker now (code written for torch reads them right after iter())."""
        self._start_deferred()

    def _start_epoch(self, worker_id: int) -> StartEpoch:
        state = self._progress.resume_streams.get(worker_id)
        return StartEpoch(epoch=self._epoch, seed=self._seed, stream_state=state)

    def __iter__(self) -> MultiWorkerIterator:
        return self

    # -- delivery ----------------------------------------------------------------
    def __next__(self) -> Any:
        if self._ledger.generation != self._generation:
            msg = (
                "this iterator was superseded by a newer iter(loader) over the same "
                "persistent workers"
            )
            raise RuntimeError(msg)
        if self._pool.state is not PoolState.RUNNING:
            raise StopIteration
        entered = time.perf_counter()
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        self._dispatch()  # the consumer may have dropped batches since the last call
        while True:
            if self._closed or self._pool.state is not PoolState.RUNNING:
                raise StopIteration  # closed by another thread while this one waited
            ready = self._take_ready()
            if ready is not None:
                batch = self._hand_out(*ready, entered)
                if batch is not SKIPPED:
                    return batch
                continue
            self._dispatch()  # skipped entries left the reorder buffer: room in the budget
            if not self._mine_pending() and self._sources_done:
                self._progress.done = True
                self._keep_take_backs()
                self.close()
                raise StopIteration
            wait = _POLL_S
            if self._head_start is not None:
                if self._head_start.over():
                    self._end_head_start()
                    continue
                wait = self._head_start.wait_s()
            if self._pool.ramp and self._pool.deferred:
                self._start_deferred(1)  # forked workers start while the trainer would wait
                wait = 0.0
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._raise_timeout()
                wait = min(wait, remaining)
            messages, deaths = self._poll(wait)
            for worker_id, message, leased in messages:
                self._receive(worker_id, message, leased)
            for death in deaths:
                self._end_head_start()
                self._handle_death(death)
            self._dispatch()  # results lowered the load; dropped batches freed slots

    def _poll(self, wait: float) -> tuple[list[tuple[int, Any, set[int]]], Any]:
        """The pool's messages and deaths within ``wait`` s; StopIteration if another thread
        closed the epoch (its workers stopped under this wait)."""
        try:
            transport_before = self._pool.transport_s
            found = self._pool.poll(wait)
            self._recorder.stats.transport_s += self._pool.transport_s - transport_before
            return found
        except Exception:
            closed = self._closed or self._pool.state is not PoolState.RUNNING
            self.close()
            if closed:
                raise StopIteration from None
            raise
        except BaseException:
            self.close()
            raise

    def _hand_out(self, task_id: int, item: Any, entered: float) -> Any:
        """The user's batch for a ready entry (raising a worker's error); ``SKIPPED`` if empty."""
        self._dispatch()
        self._progress.deliver(self._places.pop(task_id))
        if self._iterable:
            worker_id, done = self._stream_tasks.pop(task_id)
            self._progress.deliver_stream(worker_id, done, self._pool.num_workers)
        if type(item) is _Accounted:  # on_error="skip": count in delivery order
            self._record_bad_samples(item.attempted, item.skipped)  # type: ignore[misc]
            if item.empty:
                return SKIPPED
            item = item.batch
        if isinstance(item, _Raise):
            raise item.error
        waited = time.perf_counter() - entered
        self._recorder.delivered(waited)
        watch = self._pool.memory_watch
        if watch is not None and self._pool.mode == "process":
            watch.check(self._pool.pids, self._recorder.stats.batches)
        if self._autotune is not None:
            self._autotune.batch_delivered(waited, self)
        if self._trial is not None and self._switch_to is None and not self._iterable:
            self._switch_to = self._trial_switch(self._trial.batch_delivered(time.perf_counter()))
        return self._deliver(item)

    def _trial_switch(self, kind: str | None) -> str | None:
        """worker_mode="auto": swap now, or let the next epoch start with ``kind``.

        A new pool is worth starting only if enough of the epoch is left to measure it;
        otherwise the epoch ends in the pool it has and the next one starts with ``kind``.
        """
        assert self._trial is not None
        if kind is None or self._epoch_batches is None:
            return kind
        if self._epoch_batches - self._batch_index >= self._trial.batches_to_measure:
            return kind
        self._trial.defer(kind)
        return None

    def _take_ready(self) -> tuple[int, Any] | None:
        """The next batch to hand out and its task id; None when none is ready."""
        ready = self._ready
        if self._in_order:
            while self._next_yield in ready:
                task_id = self._next_yield
                item = ready.pop(task_id)
                self._next_yield += 1
                if item is not SKIPPED:
                    return task_id, item
                self._places.pop(task_id, None)
                self._stream_tasks.pop(task_id, None)
            return None
        while ready:
            task_id = min(ready)
            item = ready.pop(task_id)
            if item is not SKIPPED:
                return task_id, item
            self._places.pop(task_id, None)
            self._stream_tasks.pop(task_id, None)
        return None

    def _mine_pending(self) -> bool:
        return self._in_flight > 0

    # -- dispatch ----------------------------------------------------------------
    def _dispatch(self) -> None:
        if self._switch_to is not None:  # worker_mode="auto": drain the old pool, then swap
            if self._in_flight or self._sources_done:
                return
            self._swap_pool()
            return
        ledger, pool = self._ledger, self._pool
        budget = self._dispatch_budget()
        while not self._sources_done:
            # torch's bound: at most prefetch_factor * num_workers batches dispatched and
            # not yet handed to the consumer, counting those waiting in the reorder buffer
            if self._in_flight + len(self._ready) >= budget:
                return
            worker_id = self._pick_worker()
            if worker_id is None:
                return
            if pool.slots is not None and pool.slots.num_free == 0 and self._mine_pending():
                return  # backpressure: wait for the consumer to drop a batch
            if self._iterable:
                indices = None
            else:
                began = time.perf_counter()
                try:
                    indices = next(self._index_iter)  # type: ignore[arg-type]
                except StopIteration:
                    self._sources_done = True
                    return
                self._recorder.stats.sampling_s += time.perf_counter() - began
                if self._batch_index in self._progress.ahead:  # delivered before a resume: skip it
                    self._batch_index += 1
                    self._position += len(indices) if self._auto_collation else 1
                    continue
            slot = self._acquire_slot(worker_id)
            task_id = ledger.next_task
            ledger.next_task += 1
            ledger.pending[task_id] = Pending(
                worker_id, indices, slot, self._batch_index, self._position
            )
            self._places[task_id] = self._batch_index
            self._in_flight += 1
            ledger.load[worker_id] += 1
            self._unserved.discard(worker_id)
            keep_from = 0
            if self._iterable:
                self._sent[worker_id] += 1
                self._stream_tasks[task_id] = (worker_id, self._sent[worker_id])
                # the captures a state may still ask for: after the worker's last delivered
                # batch, or after one that many deliveries back (a pinning thread's read-ahead)
                keep_from = max(0, self._progress.streams.get(worker_id, 0) - self._take_backs)
            # a thread pool's first task goes out alone, its samples loaded by as many
            # threads as the pool has workers (the others have nothing to do yet)
            spread = self._head_start_due and self._auto_collation and not self._iterable
            task = Task(
                task_id=task_id, epoch=self._epoch, indices=indices, slot=slot,
                batch_index=self._batch_index, position=self._position, keep_from=keep_from,
                threads=pool.num_workers if spread else 1,
            )  # fmt: skip
            pool.send(worker_id, task)
            if self._head_start_due:
                self._head_start_due = False
                self._head_start = HeadStart(lambda w=worker_id: pool.cpu_s(w))
            self._batch_index += 1
            if indices is not None:
                self._position += len(indices) if self._auto_collation else 1

    def _acquire_slot(self, worker_id: int) -> Any:
        """A free slot for ``worker_id``'s next batch, one it wrote recently if it can; or None."""
        pool_slots = self._pool.slots
        if pool_slots is None:
            return None
        recent = self._recent_slots[worker_id]
        slot = pool_slots.acquire(tuple(reversed(recent)))
        if pool_slots.creation_error is not None:
            self._warn_slot_creation(pool_slots.creation_error)
        if slot is not None:
            if slot.index in recent:
                recent.remove(slot.index)
            recent.append(slot.index)
            del recent[: -self._per_worker - 1]
        return slot

    def _end_head_start(self) -> None:
        """The other workers get their tasks from now on (a first answer, or the head start
        ended: see stoker.engine.head_start)."""
        self._head_start_due = False
        self._head_start = None

    def _dispatch_budget(self) -> int:
        """How many batches may be loaded ahead (in flight or waiting in the reorder buffer).

        torch's bound, prefetch_factor x num_workers, further bounded by memory_budget once a
        batch's size is known: at most budget // batch bytes, and at least one. Before that,
        a budget the user gave lets one batch out, to learn the size; the default budget (a
        quarter of memory) lets the first wave out whole.
        """
        if self._head_start_due or self._head_start is not None:
            return 1  # the first task goes out alone (stoker.engine.head_start)
        full = self._per_worker * self._pool.num_workers
        batch_bytes = self._pool.batch_bytes
        if batch_bytes:
            return min(full, max(1, self._memory_budget // batch_bytes))
        if self._plan.budget_is_users and self._pool.mode == "process":
            return 1
        return full

    def _pick_worker(self) -> int | None:
        load, cap = self._ledger.load, self._per_worker
        if self._iterable:
            # rotation over the workers whose stream is not exhausted: strict in order (the
            # stream order is torch's); as ready, a busy worker's turn goes to the next one,
            # so a stalled worker does not hold back the others (torch does the same)
            n = len(load)
            for step in range(n):
                worker_id = (self._rotation + step) % n
                if not self._active[worker_id]:
                    continue
                # (a staggered start: the started worker takes one task until the others run)
                busy = load[worker_id] >= (1 if self._pool.deferred else cap)
                if busy or not self._pool.is_started(worker_id):
                    if self._in_order:
                        return None
                    continue
                self._rotation = (worker_id + 1) % n
                return worker_id
            if not any(self._active):
                self._sources_done = True
            return None
        candidates: Any = range(len(load))
        if self._pool.deferred:  # a staggered start: only started workers take tasks
            candidates = [w for w in candidates if self._pool.is_started(w)]
        if self._unserved:  # until each worker has one task, the others wait for theirs
            candidates = [w for w in candidates if w in self._unserved]
            if not candidates:
                return None
        worker_id = min(candidates, key=load.__getitem__)
        return worker_id if load[worker_id] < cap else None

    # -- receiving ---------------------------------------------------------------
    def _receive(self, worker_id: int, message: Any, leased: set[int]) -> None:
        if isinstance(message, Ready):
            self._pool.pids[worker_id] = message.pid
            if not self._pool.ramp:
                self._start_deferred()  # the staggered start's second step
            return
        if isinstance(message, Initialised):
            self._pool.initialised.add(worker_id)
            return
        if isinstance(message, StartupFailed):
            error = rebuild_error(
                message.failure, worker_id, "in worker_init_fn or while starting the worker", None
            )
            self._close_broken()
            raise error
        pending = _settle(self._pool, worker_id, message, leased)
        if isinstance(message, Exhausted):
            self._active[worker_id] = False
        if message.task_id < self._first_task:
            return  # an answer to an epoch this iterator replaced: its slot is back, nothing else
        self._in_flight -= 1
        self._end_head_start()
        if isinstance(message, Done):
            if message.slot_error:
                self._warn_slot_map(message, pending)
            self._ready[message.task_id] = self._on_done(message, pending, leased)
        elif isinstance(message, Exhausted):
            self._ready[message.task_id] = SKIPPED
        elif isinstance(message, Failed):
            where = (
                f"while loading indices {summary(pending.indices)}"
                if not self._iterable
                else "while iterating its copy of the IterableDataset"
            )
            pid = self._pool.pid(worker_id)
            self._ready[message.task_id] = _Raise(
                rebuild_error(message.failure, worker_id, where, pid)
            )
        elif isinstance(message, Undelivered):
            self._ready[message.task_id] = _Raise(self._undelivered(message, pending))
        else:
            raise AssertionError(f"unexpected message from worker {worker_id}: {message!r}")

    def _on_done(self, message: Done, pending: Pending, leased: set[int]) -> Any:
        """What waits in the reorder buffer for a loaded batch (and what its arrival teaches)."""
        attempted = (
            len(pending.indices) if (self._auto_collation and pending.indices is not None) else 1
        )
        self._recorder.stats.worker_idle_s += message.idle_s
        self._recorder.loaded(
            message.worker_id,
            attempted,
            message.fetch_s,
            message.collate_s,
            pending.indices,
            message.slow,
        )
        accounting = self._record_bad_samples is not None
        if accounting and message.empty:
            return _Accounted(None, attempted, message.skipped, True)
        batch = message.batch
        if not message.shards:
            self._warn_unsharded()
        pool_slots = self._pool.slots
        if pending.slot is not None and message.overflow and pool_slots is not None:
            pool_slots.want(pending.slot.index, message.nbytes + message.overflow)
        elif pending.slot is None and self._pool.mode in ("process", "thread"):
            self._maybe_create_slots(batch)
        batch = _copy_tree(batch) if (self._copy and leased) else batch
        return _Accounted(batch, attempted, message.skipped, False) if accounting else batch

    def _undelivered(self, message: Undelivered, pending: Pending) -> BaseException:
        what = (
            f"the batch at indices {summary(pending.indices)}" if not self._iterable else "a batch"
        )
        error = message.error
        add_note(
            error,
            f"Raised in the trainer while it received {what} from worker {message.worker_id}: the "
            "batch's shared memory could not be mapped. The worker and the rest of the epoch "
            "are unaffected.",
        )
        return error

    # -- stream states (NOTE [ Stream states ] in stoker.engine.stream_state) -----------
    def stream_states(self, held: int) -> tuple[dict[int, Any], int]:
        """Each worker's stream state as if the last ``held`` deliveries had not happened, and
        the worker whose batch comes next: asked of the workers now (see ask_workers)."""
        if self._ledger.generation != self._generation or self._pool.state is not PoolState.RUNNING:
            raise AssertionError("the stream states of an epoch whose workers moved on")
        return _collect_streams(
            self._pool, self._progress, held, receive=self._receive, on_death=self._handle_death
        )

    def _keep_take_backs(self) -> None:
        """The epoch's end, before its own workers stop: the states a ``state_dict()`` taking
        back a pinning thread's undelivered batches may ask for, asked now (each worker's
        stream has ended, so each holds at most those batches' samples).
        """
        progress = self._progress
        held = min(self._take_backs, len(progress.recent_streams))
        if not (self._iterable and self._owns_pool and held):
            return
        with progress.stream_lock:
            try:
                progress.taken_back_streams = {
                    h: _collect_streams(
                        self._pool, progress, h, receive=self._receive, on_death=self._handle_death
                    )
                    for h in range(1, held + 1)
                }
            except Exception as exc:  # told by the state_dict() that needs it
                add_note(exc, _ENDING_NOTE)
                progress.taken_back_streams = exc

    # -- autotuning: the Tunable protocol of stoker.engine.autotune ------------------
    @property
    def workers(self) -> int:
        return self._pool.num_workers

    @property
    def prefetch(self) -> int:
        return self._per_worker

    @property
    def batch_bytes(self) -> int:
        return self._pool.batch_bytes or 0

    @property
    def worker_idle_s(self) -> float:
        return self._recorder.stats.worker_idle_s

    def add_worker(self) -> None:
        """Starts one more worker and gives it work at once."""
        pool = self._pool
        worker_id = pool.add_worker()
        self._active.append(True)
        self._recent_slots.append([])
        self._sent.append(0)
        self._unserved.add(worker_id)
        pool.send(worker_id, StartEpoch(epoch=self._epoch, seed=self._seed))
        self._recorder.stats.num_workers = pool.num_workers
        self._hooks.workers_changed(pool.num_workers, self._per_worker)
        self._grow_slots()
        self._dispatch()

    def set_prefetch(self, prefetch: int) -> None:
        """Keeps ``prefetch`` batches per worker in flight from now on."""
        self._per_worker = prefetch
        self._hooks.workers_changed(self._pool.num_workers, prefetch)
        self._grow_slots()
        self._dispatch()

    def _grow_slots(self) -> None:
        pool_slots = self._pool.slots
        if pool_slots is not None:
            in_flight = self._per_worker * self._pool.num_workers
            pool_slots.grow(slots.slots_for(in_flight, pool_slots.slot_size, self._memory_budget))

    def _warn_slot_creation(self, error: OSError) -> None:
        """Says once that the slot pool stopped growing, and why; loading goes on without it."""
        ledger = self._ledger
        if ledger.slot_warning_given:
            return
        ledger.slot_warning_given = True
        warnings.warn(
            f"stoker could not create another shared-memory slot for batches ({error}); the "
            f"{len(self._pool.slots.names)} it has keep serving, and the batches they cannot hold "
            "travel through pipes and one-off segments, which is slower. Nothing is lost.",
            RuntimeWarning,
            stacklevel=4,
        )

    def _warn_slot_map(self, message: Done, pending: Pending) -> None:
        """Says once per worker that it could not map a slot, and that its batch came anyway."""
        warned = self._ledger.slot_map_warned
        if message.worker_id in warned:
            return
        warned.add(message.worker_id)
        where = (
            f"for indices {summary(pending.indices)}"
            if not self._iterable
            else "for a batch of its copy of the IterableDataset"
        )
        warnings.warn(
            f"stoker worker {message.worker_id} (pid {self._pool.pid(message.worker_id)}) could "
            f"not map its shared-memory slot {where} ({message.slot_error}); that batch, and any "
            "later one whose slot it cannot map, travels through the pipe instead, which is "
            "slower. Nothing is lost. If the worker ran out of file descriptors, raise the "
            "open-file limit (ulimit -n) or open fewer files in the dataset.",
            RuntimeWarning,
            stacklevel=4,
        )

    def _warn_unsharded(self) -> None:
        pool = self._pool
        if pool.num_workers < 2 or pool.warned_unsharded:
            return
        if self._plan.dataset_has_len:
            return  # a stream with a length is checked against it instead (loader._EpochIterator)
        pool.warned_unsharded = True
        name = self._plan.dataset_name
        msg = (
            f"{name} is an IterableDataset running in {pool.num_workers} workers, but it never "
            "called get_worker_info(): every worker iterates all of it, so each sample is "
            f"loaded {pool.num_workers} times. Shard the stream inside __iter__ by worker "
            "(stoker.sharding does files, then records, by rank and worker), or use "
            "num_workers=1."
        )
        warnings.warn(msg, UserWarning, stacklevel=4)

    def _maybe_create_slots(self, batch: Any) -> None:
        """After the first batches: sizes the slot pool from a real batch, within the budget.

        Process workers get shared-memory slots; thread workers slots of the trainer's own
        memory, for large batches only (see ``slots.SlotPool``'s ``in_process``).
        """
        pool, ledger = self._pool, self._ledger
        in_process = pool.mode == "thread"
        if pool.slots is not None or ledger.shm_disabled:
            return
        if not in_process and not segments.shm_available():
            return
        nbytes, arrays = transport.array_bytes(batch)
        if pool.batch_bytes is None:
            pool.batch_bytes = nbytes
        smallest = slots.IN_PROCESS_MIN_BATCH_BYTES if in_process else transport.SHM_MIN_BATCH_BYTES
        if nbytes < smallest:
            return
        plan = slots.plan_slots(
            nbytes, arrays, self._per_worker * pool.num_workers, self._memory_budget
        )
        if plan.count < plan.wanted:
            if in_process:
                return  # thread workers allocate every batch, as without slots
            warnings.warn(
                f"memory_budget={self._memory_budget / 2**20:.1f} MiB holds {plan.count} batch "
                f"slot(s) of {nbytes / 2**20:.1f} MiB, fewer than the {plan.wanted} that "
                f"num_workers={pool.num_workers} x prefetch_factor={self._per_worker} (+2 held "
                f"by you) would use: from now on at most {plan.ahead} batch(es) are loaded "
                "ahead, and batches you hold beyond the slots travel through pipes. Raise "
                "memory_budget, or lower batch_size or prefetch_factor.",
                RuntimeWarning,
                stacklevel=4,
            )
        try:
            pool.slots = slots.SlotPool(
                plan.count,
                plan.size,
                prefix=pool.prefix,
                budget=self._memory_budget,
                in_process=in_process,
            )
        except ShmError as exc:
            ledger.shm_disabled = True
            warnings.warn(
                f"{exc} Falling back to sending batches through pipes, which is slower.",
                RuntimeWarning,
                stacklevel=4,
            )

    # -- faults ------------------------------------------------------------------
    def _handle_death(self, death: WorkerDeath) -> None:
        if self._pool.state is not PoolState.RUNNING:
            return
        ledger = self._ledger
        if death.worker_id not in self._pool.initialised:
            self._close_broken()
            raise WorkerError(f"DataLoader {death.describe(starting=True)}")
        held = sorted(t for t, p in ledger.pending.items() if p.worker_id == death.worker_id)
        held_indices = [ledger.pending[t].indices for t in held]
        where = (
            f"while holding the batches at indices {summary(held_indices)}"
            if held and not self._iterable
            else (
                "while holding no batch"
                if not held
                else "while iterating its copy of the IterableDataset"
            )
        )
        if self._restart and not self._iterable:
            worst = max((ledger.pending[t].restarts for t in held), default=0)
            if worst < _MAX_RESTARTS_PER_TASK:
                try:
                    self._pool.restart(death.worker_id)
                except BaseException as exc:  # no replacement: the loader starts afresh next epoch
                    self._close_broken()
                    msg = (
                        f"DataLoader {death.describe()} {where}, and its replacement could not "
                        f"start ({type(exc).__name__}: {exc}). The workers are stopped; the next "
                        "iter(loader) starts new ones."
                    )
                    raise WorkerError(msg) from exc
                self._pool.send(death.worker_id, StartEpoch(epoch=self._epoch, seed=self._seed))
                for task_id in held:
                    pending = ledger.pending[task_id]
                    pending.restarts += 1
                    if self._pool.mode == "thread":
                        # the dead thread's lease on the slot ends whenever its frames are
                        # collected: the batch is loaded again outside the slots
                        pending.slot = None
                    task = Task(
                        task_id=task_id,
                        epoch=self._epoch,
                        indices=pending.indices,
                        slot=pending.slot,
                        batch_index=pending.batch_index,
                        position=pending.position,
                    )
                    self._pool.send(death.worker_id, task)
                warnings.warn(
                    f"DataLoader {death.describe()} {where}; started a replacement and re-issued "
                    f"its {len(held)} batch(es), so the epoch still delivers every index once.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            where += (
                f"; the same batch has now killed {worst + 1} workers, so stoker stops restarting"
            )
        hint = (
            "Pass on_worker_death='restart' to replace dead workers and re-issue their batches."
            if not self._restart and not self._iterable
            else ""
        )
        self._close_broken()
        msg = f"DataLoader {death.describe()} {where}. {hint}".rstrip()
        raise WorkerError(msg)

    def _raise_timeout(self) -> None:
        ledger = self._ledger
        mine = sorted(t for t in ledger.pending if t >= self._first_task)
        task_id = mine[0] if mine else None
        if task_id is None:
            self.close()
            raise WorkerError(
                f"DataLoader timed out after {self._timeout:g} seconds with no batch in flight"
            )
        pending = ledger.pending[task_id]
        worker_id = pending.worker_id
        pid = self._pool.pid(worker_id)
        try:
            stack = self._pool.dump_stack(worker_id)
        except Exception as exc:  # the timeout is the error; the stack is a courtesy
            stack = f"(no stack: {type(exc).__name__}: {exc})"
        finally:
            self._close_broken()
        what = (
            "the next batch"
            if self._iterable
            else f"the batch at indices {summary(pending.indices)}"
        )
        who = f"pid {pid}" if pid is not None else "a thread of this process"
        msg = (
            f"DataLoader timed out after {self._timeout:g} seconds waiting for {what} from worker "
            f"{worker_id} ({who}). Raise timeout= if batches are legitimately slow; otherwise the "
            f"worker is stuck here:\n{stack}"
        )
        raise WorkerError(msg)

    # -- lifetime ----------------------------------------------------------------
    def _close_broken(self) -> None:
        """Stops this epoch and the pool, persistent or not: one of its workers is dead or stuck.

        The loader then starts fresh workers for its next epoch instead of meeting the same
        dead worker again.
        """
        self._pool.shutdown()
        self.close()

    def close(self) -> None:
        """Stops this epoch. Non-persistent workers are shut down; safe to call twice, and
        from another thread: a ``next()`` waiting there raises StopIteration."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()
        self._ready.clear()
        self._sources_done = True


def _settle(pool: Pool, worker_id: int, message: Any, leased: set[int]) -> Pending:
    """Books a task's answer: off the ledger and the worker's load, its slot freed unless the
    batch holds it (a lease, released when the batch goes)."""
    ledger = pool.ledger
    pending = ledger.pending.pop(message.task_id, None)
    if pending is None or pending.worker_id != worker_id:
        raise AssertionError(f"worker {worker_id} answered task {message.task_id} it was not given")
    ledger.load[worker_id] -= 1
    pool_slots = pool.slots
    if pending.slot is not None and pending.slot.index not in leased and pool_slots is not None:
        pool_slots.release(pending.slot.index)
    return pending


def _settle_unwaited(pool: Pool, worker_id: int, message: Any, leased: set[int]) -> None:
    """An answer nobody waits for (its epoch is closing): booked, and dropped."""
    if isinstance(message, Ready):
        pool.pids[worker_id] = message.pid
    elif isinstance(message, Initialised):
        pool.initialised.add(worker_id)
    elif not isinstance(message, StartupFailed):
        _settle(pool, worker_id, message, leased)


def _collect_streams(
    pool: Pool, progress: Progress, held: int, *, receive: Any, on_death: Any
) -> tuple[dict[int, Any], int]:
    """Asks every started worker for its stream's state after the last of its batches that
    was delivered (``held`` deliveries back); a worker not started yet opens its stream from
    the state it was given, or afresh."""
    done, next_worker = progress.stream_resumable(held)
    requests: dict[int, tuple[int, int]] = {}
    states: dict[int, Any] = {}
    for worker_id in range(pool.num_workers):
        if pool.is_started(worker_id):
            requests[worker_id] = (progress.epoch, done.get(worker_id, 0))
        elif worker_id in progress.resume_streams:
            states[worker_id] = progress.resume_streams[worker_id]
    answers = ask_workers(pool, requests, receive=receive, on_death=on_death)
    states.update(_answered_states(pool, answers))
    return dict(sorted(states.items())), next_worker


def next_epoch_streams(pool: Pool, epoch: int) -> dict[int, Any]:
    """What each started worker of a persistent pool opens epoch ``epoch``'s stream from:
    its copy of the dataset's state now (workers with nothing to restore left out)."""
    requests = {w: (epoch, 0) for w in range(pool.num_workers) if pool.is_started(w)}
    answers = ask_workers(
        pool, requests, receive=functools.partial(_settle_unwaited, pool), on_death=_ignore
    )
    return _answered_states(pool, answers)


def _ignore(death: WorkerDeath) -> None:
    """A death while the epoch closes: the pool's shutdown that follows reaps the worker."""


def _answered_states(pool: Pool, answers: dict[int, Any]) -> dict[int, Any]:
    """The states in workers' answers; the first failure is raised as the worker's error."""
    states = {}
    for worker_id, answer in sorted(answers.items()):
        if answer.failure is not None:
            where = "while it captured its stream's state for state_dict()"
            raise rebuild_error(answer.failure, worker_id, where, pool.pid(worker_id))
        if answer.state is not None:
            states[worker_id] = answer.state
    return states


def _end_epoch(pool: Pool, progress: Progress | None, generation: int, shutdown: bool) -> None:
    """How an epoch's iterator ends, closed or garbage collected (its ``weakref.finalize``).

    An iterable dataset's epoch that ends before its last batch first keeps its streams'
    states in ``progress`` (a state_dict() after a ``break`` resumes there); not at
    interpreter exit, nor once a newer epoch took the workers, nor in a forked child that
    frees its copy of the iterator (the workers are the trainer's). Then a pool the epoch
    owns is shut down.
    """
    exiting = getattr(weakref.finalize, "_shutdown", False)  # set while atexit runs finalizers
    if (
        progress is not None
        and not progress.done
        and not exiting
        and pool.state is PoolState.RUNNING
        and pool.ledger.generation == generation
        and os.getpid() == getattr(pool, "_owner_pid", None)
    ):
        with progress.stream_lock:
            if progress.kept_streams is None:
                try:
                    progress.kept_streams = _collect_streams(
                        pool, progress, 0, receive=functools.partial(_settle_unwaited, pool),
                        on_death=_ignore,
                    )  # fmt: skip
                except Exception as exc:  # told by the state_dict() that needs it
                    add_note(exc, _CLOSING_NOTE)
                    progress.kept_streams = exc
    if shutdown:
        pool.shutdown()


def _copy_tree(obj: Any) -> Any:
    """Copies every array out of shared memory, so the batch's slot is freed at once."""
    return map_leaves(obj, _copy_leaf)


def _copy_leaf(leaf: Any) -> Any:
    if isinstance(leaf, np.ndarray):
        return leaf.copy()
    if hasattr(leaf, "numpy") and hasattr(leaf, "clone"):  # a torch tensor
        return leaf.clone()
    return leaf
