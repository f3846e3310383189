"""Worker pools: starting, talking to, watching and stopping process or thread workers.

NOTE [ Shutdown ]: the one procedure that stops a pool, whoever calls it
------------------------------------------------------------------------
:meth:`WorkerPool.shutdown` is called when an epoch ends (non-persistent workers), when
``DataLoader.close()`` or the iterator's ``close()`` is called, when an error or
KeyboardInterrupt escapes ``__next__`` (the iterator is then garbage collected), when the
loader or iterator is garbage collected, and at interpreter exit (``weakref.finalize``
runs at exit). It is idempotent, and its state only moves forward
(``RUNNING -> CLOSING -> CLOSED``). Only the process that created the pool runs it: a
forked child (another pool's worker) that frees an inherited copy of an iterator marks its
copy closed and touches nothing of the trainer's.

1. every live worker is sent ``None`` (stop after the current batch) and its task pipe
   is closed, so a worker blocked on reading also wakes up and leaves;
2. workers are joined for up to ``_JOIN_TIMEOUT_S``; a process still alive is sent
   SIGTERM, then SIGKILL; a thread still alive is a daemon and dies with the interpreter;
3. result pipes are closed;
4. the shared-memory slot pool is unlinked (arrays a consumer still holds stay valid:
   the mapping lives until the last view is collected);
5. the stack-dump files are removed.

A worker process also leaves by itself when the trainer disappears: the kernel sends it
SIGKILL (``PR_SET_PDEATHSIG`` on Linux) and its loop checks its parent every second.
Segments left by a trainer killed with SIGKILL are unlinked by the next pool created
(:func:`stoker.engine.segments.remove_orphaned_segments`), and its stack-dump files by the next
process pool (:func:`_remove_orphaned_stack_files`). Workers ignore SIGINT: Ctrl-C
reaches the trainer, whose shutdown stops them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import glob
import multiprocessing
import os
import pickle
import queue
import selectors
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stoker._proc import usable_cpus
from stoker.engine import random_scopes, segments, slots, termination, transport
from stoker.engine.messages import Task, Undelivered, WorkerSpec, add_note
from stoker.engine.worker import THREAD_ENV_VARS, process_worker_main, run_worker
from stoker.profiling.memory import GrowthWatch

__all__ = ["Death", "Pool", "PoolState", "WorkerDeath", "WorkerPool", "begin_shutdown"]

_JOIN_TIMEOUT_S = 2.0
_TERMINATE_TIMEOUT_S = 1.0
_STACK_DUMP_WAIT_S = 0.3
_REAP_TIMEOUT_S = 1.0
_STACK_FILE_PREFIX = "stoker-stack-"  # + trainer pid: see _remove_orphaned_stack_files


class PoolState(enum.Enum):
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Death:
    """A worker found dead: its id, pid and exit code (negative: killed by a signal)."""

    worker_id: int
    pid: int | None
    exitcode: int | None

    def describe(self, *, starting: bool = False) -> str:
        """What happened, for a message; ``starting``: before ``worker_init_fn`` returned."""
        if starting:
            how = (
                "stopped"
                if self.exitcode is None
                else f"exited with status {self.exitcode}"
                if self.exitcode >= 0
                else f"was killed by {_signal_name(-self.exitcode)}"
            )
            return (
                f"worker {self.worker_id} (pid {self.pid}) {how} while starting, before it "
                "loaded any batch: in worker_init_fn, or while importing the dataset's modules "
                "in the new process. What it printed, if anything, is above on stderr; with "
                "num_workers=0 the same code runs in the main process, where a debugger can "
                "stop at it. A replacement would fail the same way, so stoker does not start "
                "one."
            )
        if self.exitcode is not None and self.exitcode < 0:
            signum = -self.exitcode
            cause = f"was killed by {_signal_name(signum)}"
            if signum == signal.SIGKILL:
                cause += (
                    " (most likely the out-of-memory killer: check `dmesg`, lower batch_size, "
                    "num_workers or prefetch_factor, or keep less per-sample data in memory)"
                )
            elif signum == signal.SIGSEGV:
                cause += (
                    " (a segmentation fault in native code: a C extension used by the dataset?)"
                )
            elif signum == signal.SIGBUS:
                cause += (
                    " (a bus error: a memory-mapped file was read past its end. Either /dev/shm "
                    "is full (give the container more --shm-size), or a file the dataset maps (a "
                    "packed shard, an .npy opened with mmap_mode) shrank or was rewritten while "
                    "it was read)"
                )
        elif self.exitcode is None:
            cause = "stopped unexpectedly"
        else:
            cause = f"exited with status {self.exitcode} (os._exit or sys.exit in the dataset?)"
        return f"worker {self.worker_id} (pid {self.pid}) {cause}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _ProcessWorker:
    __slots__ = ("process", "results", "tasks")

    def __init__(self, process: Any, tasks: Any, results: Any) -> None:
        self.process = process
        self.tasks = tasks
        self.results = results


class _ThreadWorker:
    __slots__ = ("cpu_clock", "tasks", "thread")

    def __init__(self, thread: threading.Thread, tasks: queue.SimpleQueue[Any]) -> None:
        self.thread = thread
        self.tasks = tasks
        # the thread's CPU-time clock, taken while it runs (on an ended thread the clock
        # reads as an error, where asking for it again would not be safe); None where the
        # platform has no such clock
        self.cpu_clock: int | None = None
        if hasattr(time, "pthread_getcpuclockid") and thread.ident is not None:
            with contextlib.suppress(OSError):
                self.cpu_clock = time.pthread_getcpuclockid(thread.ident)


@dataclass(slots=True)
class Pending:
    """A task sent to a worker and not answered yet: enough to re-issue it or name it."""

    worker_id: int
    indices: Any
    slot: slots.SlotRef | None
    batch_index: int
    position: int
    restarts: int = 0


@dataclass(slots=True)
class Ledger:
    """Tasks in flight on a pool; outlives an iterator when workers are persistent."""

    pending: dict[int, Pending] = field(default_factory=dict)
    load: list[int] = field(default_factory=list)  # tasks in flight per worker
    next_task: int = 0
    generation: int = 0  # which iterator owns the pool now (a newer one supersedes the older)
    shm_disabled: bool = False  # the slot pool could not be made: batches travel through pipes
    slot_warning_given: bool = False
    slot_map_warned: set[int] = field(default_factory=set)  # workers that could not map a slot


class WorkerDeath(Protocol):
    """A dead worker as a pool reports it: :class:`Death`, or a Ray actor's ``RayDeath``."""

    @property
    def worker_id(self) -> int: ...

    def describe(self, *, starting: bool = False) -> str: ...


@runtime_checkable
class Pool(Protocol):
    """What the epoch's iterator and the loader use of a pool of workers.

    :class:`WorkerPool` (processes or threads on this machine) and
    :class:`~stoker.engine.ray_workers.RayPool` (Ray actors) both provide it, so
    :class:`~stoker.engine.multi_worker.MultiWorkerIterator` runs an epoch over either.
    """

    mode: str  # "process", "thread" or "ray"
    state: PoolState
    num_workers: int
    prefix: str  # what the names of its shared-memory segments start with ("" for Ray)
    ledger: Ledger
    slots: slots.SlotPool | None  # made by the first epoch, once a batch's size is known
    pids: dict[int, int]
    initialised: set[int]  # workers past worker_init_fn (see Initialised)
    batch_bytes: int | None
    warned_unsharded: bool
    deferred: list[int]  # workers a staggered start holds back
    ramp: bool  # deferred workers start one at a time, whenever the trainer would wait
    transport_s: float

    @property
    def memory_watch(self) -> GrowthWatch | None: ...

    def is_started(self, worker_id: int) -> bool: ...

    def start_deferred(self, limit: int | None = None) -> list[int]: ...

    def processes(self) -> list[Any]: ...

    def add_worker(self) -> int: ...

    def restart(self, worker_id: int) -> None: ...

    def send(self, worker_id: int, message: Any) -> bool: ...

    def poll(
        self, timeout: float
    ) -> tuple[list[tuple[int, Any, set[int]]], Sequence[WorkerDeath]]: ...

    def pid(self, worker_id: int) -> int | None: ...

    def cpu_s(self, worker_id: int) -> float | None: ...

    def dump_stack(self, worker_id: int) -> str: ...

    def shutdown(self) -> None: ...


def begin_shutdown(pool: Any) -> bool:
    """The opening of every pool's ``shutdown``: True when this call is the one to stop it.

    Idempotent: a pool already closing or closed is left alone. Only the process that made
    the pool stops it: in a forked copy (a worker of another pool collecting garbage it
    inherited) the pool, its workers and its segments belong to the trainer, so the copy is
    only marked closed. Otherwise the pool moves to CLOSING.
    """
    if pool.state is not PoolState.RUNNING:
        return False
    if os.getpid() != pool._owner_pid:
        pool.state = PoolState.CLOSED
        return False
    pool.state = PoolState.CLOSING
    return True


class WorkerPool:
    """Runs ``num_workers`` workers of one kind and carries messages to and from them.

    Args:
        spec: what every worker needs (dataset, collate_fn, ...).
        num_workers: how many workers.
        mode: ``"process"`` or ``"thread"``.
        context: the multiprocessing context for process workers.
    """

    def __init__(self, spec: WorkerSpec, num_workers: int, mode: str, context: Any) -> None:
        self.prefix = segments.new_prefix()
        if mode == "process" and segments.shm_available():
            segments.hold_prefix(
                self.prefix
            )  # the pool's segments are alive while the lock is held
            spec = dataclasses.replace(spec, segment_prefix=self.prefix)
        self.spec = spec
        self.num_workers = num_workers
        self.mode = mode
        self.context = context or multiprocessing.get_context()
        self.state = PoolState.RUNNING
        self._owner_pid = os.getpid()  # only this process may shut the pool down
        self.slots: slots.SlotPool | None = (
            None  # made by the first epoch, once a batch's size is known
        )
        self.pids: dict[int, int] = {}
        self.initialised: set[int] = set()  # workers past worker_init_fn (see Initialised)
        self.ledger = Ledger(
            load=[0] * num_workers
        )  # tasks in flight: outlives an epoch's iterator
        self.memory_watch = GrowthWatch()  # the workers' private memory, for the growth warning
        self.batch_bytes: int | None = None  # a batch's shared-memory bytes, once one was seen
        self.warned_unsharded = False
        self._workers: list[Any] = [None] * num_workers
        self._results: queue.SimpleQueue[Any] = queue.SimpleQueue()  # thread mode
        # thread mode: the lease on each task's slot, taken as the task is sent and handed
        # to the worker that collates into it (the slot is free again once the lease and
        # every view of it are gone)
        self._leases: dict[int, object] = {}
        self._stopping = threading.Event()  # thread mode: set by shutdown(), seen between tasks
        self._stack_files: list[str | None] = [None] * num_workers
        self.transport_s = 0.0  # time spent decoding workers' messages (loader.stats())
        self._payload: bytes | None = None
        # spawn / forkserver with a spec that multiprocessing shares only while starting a
        # process (a Lock, Semaphore, Value, Queue): each worker gets it as a Process argument
        self._inherit = False
        self._selector: selectors.BaseSelector | None = None
        self._unsent: list[int] = []
        if mode == "process":
            termination.register(
                self
            )  # SIGTERM stops it (and its segments go) before the trainer ends
            _remove_orphaned_stack_files()
            # Wrap the global RNG functions here, before forking, so each worker inherits the
            # wrapped modules instead of re-wrapping them after fork (2 ms of page copies each).
            random_scopes.install()
        # A spawned worker spends a few hundred ms of CPU importing; more of them started
        # together than there are CPUs would all be late. As many as there are CPUs start at
        # once (each boots on a CPU of its own while the trainer waits) and the rest, in
        # parallel, once worker 0 is ready: the first batch comes as fast as with one
        # worker, and an epoch that needs every worker (an IterableDataset split between
        # them) does not wait for two boots one after the other.
        # A forked worker costs the trainer itself a fork (3-8 ms with torch loaded), one
        # after the other: 64 of them would hold the first batch back by a quarter of a
        # second. Worker 0 starts alone and the rest start one at a time, whenever the
        # trainer would otherwise wait (the "ramp", driven by the epoch's iterator).
        staggered = mode == "process" and num_workers > 1
        self.ramp = staggered and self.context.get_start_method() == "fork"
        at_once = 1 if self.ramp else min(num_workers, usable_cpus())
        self.deferred: list[int] = list(range(at_once, num_workers)) if staggered else []
        try:
            for worker_id in range(num_workers):
                if worker_id not in self.deferred:
                    self._start(worker_id)
            self._send_specs()
        except BaseException:
            self.shutdown()
            raise

    def is_started(self, worker_id: int) -> bool:
        return self._workers[worker_id] is not None

    def start_deferred(self, limit: int | None = None) -> list[int]:
        """Starts the workers held back by the staggered start (at most ``limit``); their ids."""
        cut = len(self.deferred) if limit is None else limit
        started, self.deferred = self.deferred[:cut], self.deferred[cut:]
        if started:
            self._close_selector()
            for worker_id in started:
                self._start(worker_id)
            self._send_specs()
        return started

    # -- starting ----------------------------------------------------------------
    def _start(self, worker_id: int) -> None:
        if self.mode == "thread":
            self._start_thread(worker_id)
        else:
            self._start_process(worker_id)

    def _start_thread(self, worker_id: int) -> None:
        tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        results = self._results

        def send(message: Any, _allocator: Any) -> None:
            results.put((worker_id, message))

        def receive_ready() -> list[Any]:
            ready = []
            with contextlib.suppress(queue.Empty):
                while True:
                    ready.append(tasks.get_nowait())
            return ready

        thread = threading.Thread(
            target=run_worker,
            args=(worker_id, self.spec, tasks.get, send, self._attach_leased, False, receive_ready),
            kwargs={"stopped": self._stopping.is_set},
            name=f"stoker-worker-{worker_id}",
            daemon=True,
        )
        thread.start()
        self._workers[worker_id] = _ThreadWorker(thread, tasks)

    def _start_process(self, worker_id: int) -> None:
        if multiprocessing.current_process().daemon:
            msg = (
                "this DataLoader runs inside a worker process (of another DataLoader, or any "
                "daemonic process), and such a process cannot start processes of its own. Give the "
                "inner DataLoader num_workers=0, or worker_mode='thread'."
            )
            raise RuntimeError(msg)
        context = self.context
        fd, stack_file = tempfile.mkstemp(prefix=f"{_STACK_FILE_PREFIX}{os.getpid()}-{worker_id}-")
        os.close(fd)
        self._stack_files[worker_id] = stack_file
        task_reader, task_writer = context.Pipe(duplex=False)
        result_reader, result_writer = context.Pipe(duplex=False)
        forked = context.get_start_method() == "fork"
        with_spec = forked or self._inherit  # else the spec follows as bytes (_send_specs)
        process = context.Process(
            target=process_worker_main,
            args=(
                worker_id,
                task_reader,
                result_writer,
                self.spec if with_spec else None,
                os.getpid(),
                stack_file,
                # the kernel's parent-death signal follows the starting thread, not the process
                threading.current_thread() is threading.main_thread(),
            ),
            name=f"stoker-worker-{worker_id}",
            daemon=True,
        )
        try:
            with _thread_env(None if forked else self.spec.threads):
                process.start()
        except BaseException as exc:
            for end in (task_reader, task_writer, result_reader, result_writer):
                end.close()
            if not forked and _is_pickle_error(exc):
                self._explain_pickle_error(exc)
            raise
        task_reader.close()
        result_writer.close()
        self._workers[worker_id] = _ProcessWorker(process, task_writer, result_reader)
        if not with_spec:
            self._unsent.append(worker_id)

    def _send_specs(self) -> None:
        """spawn / forkserver: the spec (with the dataset) is pickled once, sent to each worker.

        Called after every worker has started, so the workers boot in parallel and
        each reads its copy as soon as its interpreter is up.
        """
        if not self._unsent:
            return
        if self._payload is None:
            try:
                self._payload = self._encode_spec()
            except RuntimeError as exc:
                if not _needs_inheritance(exc):
                    raise
                self._start_inheriting()
                return
            except Exception as exc:
                if _is_pickle_error(exc):
                    self._explain_pickle_error(exc)
                raise
        for worker_id in self._unsent:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._workers[worker_id].tasks.send_bytes(self._payload)
        self._unsent.clear()

    def _start_inheriting(self) -> None:
        """Restarts the workers waiting for the spec so that they get it as they start.

        multiprocessing pickles a Lock, Semaphore, Value or Queue only while it starts a
        process (they travel as names and file descriptors of that process), so a spec
        holding one cannot be pickled once for every worker. As torch does, each worker
        then gets the spec as a Process argument. The workers already started were
        waiting for their spec and have done nothing yet.
        """
        self._inherit = True
        waiting, self._unsent = self._unsent, []
        for worker_id in waiting:
            old = self._workers[worker_id]
            self._workers[worker_id] = None
            old.process.terminate()
            old.process.join()
            for end in (old.tasks, old.results):
                with contextlib.suppress(OSError):
                    end.close()
            with contextlib.suppress(ValueError):
                old.process.close()
            with contextlib.suppress(OSError):
                os.unlink(self._stack_files[worker_id] or "")
            self._start_process(worker_id)

    def _explain_pickle_error(self, exc: BaseException) -> None:
        """Warns as torch does, and notes on ``exc`` which part of the spec failed and why."""
        method = self.context.get_start_method()
        warnings.warn(
            "Got pickle error when attempting to start a worker Process. "
            f"{method} workers receive the dataset, collate_fn and worker_init_fn pickled, "
            f"and pickling failed with {type(exc).__name__}: {exc}. Python 3.14+ starts "
            "workers with 'forkserver' by default on Linux; multiprocessing_context='fork' "
            "starts them by fork instead, and worker_mode='thread' runs the workers as threads: "
            "neither pickles anything.",
            UserWarning,
            stacklevel=4,
        )
        culprit = _unpicklable_part(self.spec)
        if culprit is None:
            where = "what its workers need (the dataset, collate_fn and worker_init_fn)"
            fix = "make them picklable"
        elif culprit[0] == "dataset":
            where = f"the dataset ({culprit[1]})"
            fix = "keep only picklable attributes in it (no lambdas, local functions or open files)"
        else:
            where = f"{culprit[0]} ({culprit[1]})"
            fix = "define it at module level"
        add_note(
            exc,
            f"stoker could not pickle {where} for its {method} workers; {fix}, "
            "use multiprocessing_context='fork', or worker_mode='thread'",
        )

    def processes(self) -> list[Any]:
        """The ``multiprocessing.Process`` of each process worker, in worker order."""
        return [w.process for w in self._workers if isinstance(w, _ProcessWorker)]

    def add_worker(self) -> int:
        """Starts one more worker (autotuning); returns its id."""
        worker_id = self.num_workers
        self._close_selector()
        self._workers.append(None)
        self._stack_files.append(None)
        self.ledger.load.append(0)
        self.num_workers += 1
        self._start(worker_id)
        self._send_specs()
        return worker_id

    def _encode_spec(self) -> bytes:
        """The spec, pickled once; its large arrays go to one shared segment all workers map.

        So under spawn and forkserver a dataset's array payload exists once in memory
        however many workers there are, and each worker unpickles only the small rest.
        The segment lives under the pool's prefix and goes at shutdown.
        """
        if self.spec.segment_prefix is None:
            return pickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL)
        try:  # sparse: only what is written takes memory
            writer = slots.OneoffWriter(
                f"{self.prefix}-spec", min(segments.free_bytes(), 1 << 36), shared=True
            )
        except OSError:
            return pickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            return transport.encode(self.spec, writer)
        finally:
            writer.close()

    def restart(self, worker_id: int) -> None:
        """Replaces a dead worker with a fresh one under the same id."""
        self._close_selector()
        old = self._workers[worker_id]
        if isinstance(old, _ProcessWorker):
            with contextlib.suppress(OSError):
                old.tasks.close()
            with contextlib.suppress(OSError):
                old.results.close()
            old.process.join(0)
            with contextlib.suppress(ValueError):
                old.process.close()
            with contextlib.suppress(OSError):
                os.unlink(self._stack_files[worker_id] or "")
        self._workers[worker_id] = None  # gone: a failed start below leaves nothing half-closed
        self.initialised.discard(worker_id)
        self._start(worker_id)
        self._send_specs()

    # -- talking -----------------------------------------------------------------
    def send(self, worker_id: int, message: Any) -> bool:
        """Sends a message; False when the worker is gone (its death is reported by poll)."""
        worker = self._workers[worker_id]
        if worker is None:  # not started yet (staggered start)
            return False
        if isinstance(worker, _ThreadWorker):
            if isinstance(message, Task) and message.slot is not None and self.slots is not None:
                self._leases[message.slot.index] = self.slots.lease(message.slot.index)
            worker.tasks.put(message)
            return True
        try:
            worker.tasks.send(message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def poll(self, timeout: float) -> tuple[list[tuple[int, Any, set[int]]], list[Death]]:
        """Waits up to ``timeout`` s; returns ``(worker_id, message, leased slots)`` and deaths."""
        if self.mode == "thread":
            return self._poll_threads(timeout), self._dead_threads()
        workers: list[_ProcessWorker] = self._workers
        if self._selector is None:  # one epoll set, kept across calls (rebuilt on restart)
            self._selector = selectors.DefaultSelector()
            for i, w in enumerate(workers):
                if w is None:
                    continue
                self._selector.register(w.results.fileno(), selectors.EVENT_READ, (False, i))
                self._selector.register(w.process.sentinel, selectors.EVENT_READ, (True, i))
        messages: list[tuple[int, Any, set[int]]] = []
        dead: list[int] = []
        for key, _events in self._selector.select(timeout):
            is_sentinel, worker_id = key.data
            if is_sentinel:
                dead.append(worker_id)
            else:
                messages.extend(self._drain(worker_id))
        deaths = []
        for worker_id in dead:
            messages.extend(self._drain(worker_id))  # what it sent before dying still counts
            process = workers[worker_id].process
            # the sentinel fires as the dying process closes its files, a moment before the
            # kernel has its exit status: join(0) could still read exitcode None
            process.join(_REAP_TIMEOUT_S)
            deaths.append(Death(worker_id, process.pid, process.exitcode))
        return messages, deaths

    def _drain(self, worker_id: int) -> Iterator[tuple[int, Any, set[int]]]:
        reader = self._workers[worker_id].results
        lease = self.slots.lease if self.slots is not None else _no_slots
        while True:
            try:  # only a failed receive means the worker is gone
                if not reader.poll(0):
                    return
                payload = reader.recv_bytes()
            except (EOFError, OSError):
                return
            began = time.perf_counter()
            try:
                message, leased = transport.decode(payload, lease)
            except transport.UnreadableAnswer as exc:  # that batch's error, not the worker's end
                answer = exc.message
                error = exc.__cause__ or exc
                yield (
                    worker_id,
                    Undelivered(answer.task_id, answer.epoch, worker_id, error),
                    exc.leased,
                )
                continue
            finally:
                self.transport_s += time.perf_counter() - began
            yield worker_id, message, leased

    def _attach_leased(self, ref: slots.SlotRef) -> slots.SlotAllocator:
        """A thread worker's allocator over the slot its task names (leased when it was sent)."""
        lease = self._leases.pop(ref.index, None)
        if lease is None:  # shutdown() took the leases back: the batch goes by the queue
            raise OSError(f"the loader was closed before slot {ref.index} was used")
        return slots.SlotAllocator(ref, lease)

    def _poll_threads(self, timeout: float) -> list[tuple[int, Any, set[int]]]:
        try:
            first = self._results.get(timeout=timeout)
        except queue.Empty:
            return []
        items = [first]
        while True:
            try:
                items.append(self._results.get_nowait())
            except queue.Empty:
                break
        return [(worker_id, message, self._leased_by(message)) for worker_id, message in items]

    def _leased_by(self, message: Any) -> set[int]:
        """The slot a thread worker's answer came in: leased when its task was sent, so the
        lease (not the trainer) frees it, once the batch's last view is gone."""
        pending = self.ledger.pending.get(getattr(message, "task_id", -1))
        if pending is None or pending.slot is None or pending.slot.kind is not slots.SlotKind.POOL:
            return set()
        return {pending.slot.index}

    def _dead_threads(self) -> list[Death]:
        return [
            Death(i, None, None)
            for i, w in enumerate(self._workers)
            if w is not None and not w.thread.is_alive() and self.state is PoolState.RUNNING
        ]

    def pid(self, worker_id: int) -> int | None:
        worker = self._workers[worker_id]
        return worker.process.pid if isinstance(worker, _ProcessWorker) else None

    def cpu_s(self, worker_id: int) -> float | None:
        """The CPU seconds a thread worker has used; None for processes or where unreadable."""
        worker = self._workers[worker_id]
        if not isinstance(worker, _ThreadWorker) or worker.cpu_clock is None:
            return None
        try:
            return time.clock_gettime(worker.cpu_clock)
        except OSError:  # the thread has ended
            return None

    def dump_stack(self, worker_id: int) -> str:
        """The Python stack of a (stuck) worker, as text."""
        worker = self._workers[worker_id]
        if isinstance(worker, _ThreadWorker):
            frame = sys._current_frames().get(worker.thread.ident or -1)
            return (
                "".join(traceback.format_stack(frame))
                if frame is not None
                else "(thread not running)"
            )
        path = self._stack_files[worker_id]
        if path is None or worker.process.pid is None:
            return "(no stack available)"
        size_before = os.path.getsize(path)
        try:
            os.kill(worker.process.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(the worker has exited)"
        deadline = time.monotonic() + _STACK_DUMP_WAIT_S
        while time.monotonic() < deadline and os.path.getsize(path) == size_before:
            time.sleep(0.01)
        time.sleep(0.05)  # let faulthandler finish writing every thread
        with open(path) as f:
            f.seek(size_before)
            return f.read() or "(the worker did not answer the stack request)"

    # -- stopping ----------------------------------------------------------------
    def _close_selector(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None

    def shutdown(self) -> None:
        """Stops every worker and frees every resource; see NOTE [ Shutdown ]."""
        if not begin_shutdown(self):
            return
        self._close_selector()
        self._stopping.set()  # a thread worker loads no task queued behind the one it is on
        try:
            for worker in self._workers:
                if worker is None:
                    continue
                if isinstance(worker, _ThreadWorker):
                    _drain(worker.tasks)
                    worker.tasks.put(None)
                    continue
                with contextlib.suppress(BrokenPipeError, OSError):
                    worker.tasks.send(None)
                with contextlib.suppress(OSError):
                    worker.tasks.close()
            deadline = time.monotonic() + _JOIN_TIMEOUT_S
            for worker in self._workers:
                if worker is None:
                    continue
                if isinstance(worker, _ThreadWorker):
                    worker.thread.join(max(0.0, deadline - time.monotonic()))
                    continue
                process = worker.process
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.terminate()
                    process.join(_TERMINATE_TIMEOUT_S)
                if process.is_alive():
                    process.kill()
                    process.join()
                with contextlib.suppress(OSError):
                    worker.results.close()
                # not process.close(): code that kept the Process (torch's `iterator._workers`)
                # still reads its pid and exit code; its last fd closes when it is collected
        finally:
            self._leases.clear()
            if self.slots is not None:
                self.slots.close()
            segments.sweep(self.prefix)
            for path in self._stack_files:
                if path is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            self.state = PoolState.CLOSED


def _drain(tasks: queue.SimpleQueue[Any]) -> None:
    """Drops the messages waiting in a thread worker's queue."""
    with contextlib.suppress(queue.Empty):
        while True:
            tasks.get_nowait()


def _needs_inheritance(exc: RuntimeError) -> bool:
    """multiprocessing's refusal to pickle a synchronisation object outside process start."""
    return "through inheritance" in str(exc)


def _is_pickle_error(exc: BaseException) -> bool:
    """What pickling an unpicklable object raises (torch's loader warns on the same three)."""
    return isinstance(exc, (TypeError, AttributeError, pickle.PicklingError))


def _unpicklable_part(spec: WorkerSpec) -> tuple[str, str] | None:
    """("dataset" / "collate_fn" / "worker_init_fn", its name) of the first that fails to pickle."""
    for part in ("dataset", "collate_fn", "worker_init_fn"):
        value = getattr(spec, part)
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except RuntimeError:
            continue  # multiprocessing objects: picklable while a process starts
        except Exception:
            if part == "dataset":
                return part, type(value).__name__
            name = getattr(value, "__qualname__", None) or type(value).__name__
            return part, name.rsplit(".", 1)[-1]
    return None


def _remove_orphaned_stack_files() -> None:
    """Removes the stack-dump files of trainers that died without cleaning up (SIGKILL)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), _STACK_FILE_PREFIX + "*")):
        pid_text = os.path.basename(path)[len(_STACK_FILE_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        except PermissionError:
            pass  # alive, someone else's


def _no_slots(index: int) -> object:
    raise AssertionError(f"a message referenced slot {index} but no slot pool exists")


@contextlib.contextmanager
def _thread_env(threads: int | None) -> Iterator[None]:
    """Sets the thread-count variables while a spawned child starts, so its BLAS obeys them."""
    if threads is None:
        yield
        return
    saved = {name: os.environ.get(name) for name in THREAD_ENV_VARS}
    os.environ.update({name: str(threads) for name in THREAD_ENV_VARS})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
