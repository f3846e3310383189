"""The worker loop, shared by process and thread workers.

A worker receives a :class:`~stoker.engine.messages.WorkerSpec` once, then a stream of
:class:`StartEpoch` and :class:`Task` messages; it fetches through the same fetchers as
the main process, collates (into a shared-memory slot for process workers) and reports
:class:`Done`, :class:`Exhausted` or :class:`Failed`. ``None`` stops it. A process worker
also stops when its parent disappears.

A process worker hands its encoded answers to a :class:`_Sender` thread, which writes them
to the trainer, and goes straight on to its next task. Writing them from the loop itself
cost short batches up to half their throughput on a busy machine: a pipe write that wakes
a waiting reader tells the kernel that the writer is about to sleep, so the trainer takes
the worker's CPU and the worker, which is not going to sleep, waits in the run queue
behind every other runnable process (see docs/engine.md, "Hand-offs").

Seeds, in torch's order: at its first :class:`StartEpoch` a worker learns its seed (the
epoch's base seed + its id), seeds the global generators with it (process workers), sets
its :class:`~stoker.WorkerInfo`, and only then runs ``worker_init_fn``. The global
generators ``worker_init_fn`` seeds are left to it from then on (see
:func:`stoker.randomness.leave_to_user`): not reseeded at later epochs, not served from
per-sample scopes.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import queue
import random
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from stoker import randomness
from stoker._worker_info import WorkerInfo, WorkerRNG, _consulted, _set_worker_info
from stoker.collate import collate_into
from stoker.engine import shm, transport
from stoker.engine.fetch import AllSkipped, IterableFetcher, MapFetcher
from stoker.engine.messages import (
    Done,
    Exhausted,
    Failed,
    Ready,
    StartEpoch,
    Task,
    WorkerSpec,
    add_note,
)

__all__ = ["THREAD_ENV_VARS", "cap_threads", "process_worker_main", "run_worker"]

_PARENT_POLL_S = 1.0
_SENDER_FLUSH_TIMEOUT_S = 1.0  # a stopping worker waits this long for its last answers; under
# the trainer's _JOIN_TIMEOUT_S, so a worker whose trainer stopped reading still exits by itself
_ALIGN_SLACK = 64
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def cap_threads(threads: int) -> None:
    """Caps BLAS / OpenMP / torch / OpenCV thread pools in this process to ``threads``."""
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)
    try:  # already-loaded BLAS libraries ignore the environment; threadpoolctl reaches them
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(threads)


_GENERATOR_NAMES = {"numpy": "numpy's", "python": "Python's", "torch": "torch's"}


def seed_worker(seed: int, skip: frozenset[str] = frozenset()) -> None:
    """Seeds Python's ``random``, numpy's global RNG and (when loaded) torch, except ``skip``."""
    if "python" not in skip:
        random.seed(seed)
    if "numpy" not in skip:
        np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None and "torch" not in skip:
        # the CPU generator only: torch.manual_seed also wakes CUDA (ms)
        torch.default_generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)


def run_worker_init_fn(spec: WorkerSpec, info: WorkerInfo, owns_process: bool) -> frozenset[str]:
    """Runs ``worker_init_fn``; returns the global generators it seeded, now left to it.

    In a process worker those generators stop being served from per-sample scopes (the
    user's seed wins, as with torch). A thread worker shares the trainer's generators,
    so seeding them there changes nothing for loading, and stoker says so.
    """
    if spec.worker_init_fn is None:
        return frozenset()
    torch_was_loaded = "torch" in sys.modules
    with randomness.seeding_watch() as seeded:
        spec.worker_init_fn(info.id)
    if not owns_process:
        if seeded:
            names = [_GENERATOR_NAMES[g] for g in randomness.GENERATORS if g in seeded]
            what = " and ".join(names) + (" global generators" if len(names) > 1 else " global generator")
            msg = (
                f"worker_init_fn seeded {what} in a thread worker, but thread workers share the "
                "trainer's global generators: draws made while loading still come from stoker's "
                "per-sample generators. For a stream of your own in each thread worker, use "
                "get_worker_info().rng, or use worker_mode='process'."
            )
            warnings.warn(msg, UserWarning, stacklevel=2)
        return frozenset()
    if not torch_was_loaded and "torch" in sys.modules:  # worker_init_fn imported torch
        if "torch" not in seeded:
            seed_worker(info.seed, skip=frozenset({"numpy", "python"}))
        _set_worker_info(info, owns_process=True)  # torch's get_worker_info answers too
    left = frozenset(seeded)
    randomness.leave_to_user(left)
    return left


def failure(task_id: int, epoch: int, worker_id: int, exc: BaseException) -> Failed:
    try:
        blob: bytes | None = pickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        blob = None
    return Failed(
        task_id=task_id,
        epoch=epoch,
        worker_id=worker_id,
        pid=os.getpid(),
        exception=blob,
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        text=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )


def run_worker(
    worker_id: int,
    spec: WorkerSpec,
    receive: Callable[[], Any],
    send: Callable[[Any, shm.SlotAllocator | None], None],
    attach: Callable[[shm.SlotRef], shm.SlotAllocator] | None,
    seed_globals: bool = True,
) -> None:
    """The loop itself. ``receive()`` returns the next message (``None`` to stop).

    ``seed_globals``: the worker owns its process, so it may seed the global RNGs and set
    process-wide state (process workers; a thread worker shares both with the trainer).
    """
    epoch, epoch_seed, fetcher = -1, 0, None
    initialised = False  # worker_init_fn runs at the first StartEpoch, once seeded
    left_to_user: frozenset[str] = frozenset()
    method = "multiprocessing" if seed_globals else "thread"
    send(Ready(worker_id, os.getpid()), None)
    idle = 0.0
    while True:
        waiting = perf_counter()
        message = receive()
        idle += perf_counter() - waiting
        if message is None:
            return
        if isinstance(message, StartEpoch):
            epoch, epoch_seed = message.epoch, message.seed
            seed = message.seed + worker_id
            rng = None if seed_globals else WorkerRNG.seeded(seed)
            info = WorkerInfo(
                id=worker_id, num_workers=spec.num_workers, seed=seed, dataset=spec.dataset, rng=rng, worker_method=method
            )
            _set_worker_info(info, owns_process=seed_globals)
            if seed_globals:
                seed_worker(seed, skip=left_to_user)
            if not initialised:
                initialised = True
                try:
                    left_to_user = run_worker_init_fn(spec, info, seed_globals)
                except BaseException as exc:
                    send(failure(-1, epoch, worker_id, exc), None)
                    return
            set_epoch = getattr(spec.dataset, "set_epoch", None)
            if callable(set_epoch):
                try:
                    set_epoch(epoch)
                except BaseException as exc:
                    send(failure(-1, epoch, worker_id, exc), None)
                    return
            fetcher = None
            continue
        task: Task = message
        allocator = None
        try:
            if attach is not None and task.slot is not None:
                allocator = attach(task.slot)
            if fetcher is None:
                fetcher = (
                    IterableFetcher(
                        spec.dataset, spec.batch_size, spec.collate_fn, spec.drop_last, epoch_seed + worker_id
                    )
                    if spec.iterable
                    else MapFetcher(spec.dataset, spec.auto_collation, spec.collate_fn, spec.skip_errors)
                )
            with collate_into(allocator) if allocator is not None else contextlib.nullcontext():
                if spec.iterable:
                    batch = fetcher.fetch(task.batch_index)  # type: ignore[call-arg]
                else:
                    batch = fetcher.fetch(task.indices, epoch_seed, task.batch_index, task.position)  # type: ignore[call-arg]
        except StopIteration:
            send(Exhausted(task.task_id, epoch, worker_id), None)
            continue
        except AllSkipped:
            skipped = fetcher.take_skipped()  # type: ignore[union-attr]
            send(Done(task.task_id, epoch, worker_id, None, 0, 0, True, skipped, True), None)
            continue
        except BaseException as exc:
            send(failure(task.task_id, epoch, worker_id, exc), None)
            continue
        shards = not spec.iterable or _consulted()
        used, overflow = (allocator.used, allocator.overflow) if allocator is not None else (0, 0)
        if isinstance(fetcher, MapFetcher):
            done = Done(
                task.task_id, epoch, worker_id, batch, used, overflow, shards, fetcher.take_skipped(), False,
                fetcher.fetch_s, fetcher.collate_s, fetcher.slow_samples, idle,
            )
        else:
            done = Done(task.task_id, epoch, worker_id, batch, used, overflow, shards, idle_s=idle)
        idle = 0.0
        try:
            send(done, allocator)
        except Exception as exc:  # the answer cannot be encoded: that batch's error, not the worker's end
            add_note(
                exc,
                "stoker could not send this batch to the trainer: a process worker pickles what "
                "collate_fn returns (its numpy arrays and tensors travel through shared memory)",
            )
            send(failure(task.task_id, epoch, worker_id, exc), None)


class _Sender:
    """Writes a process worker's messages to the trainer from a thread of its own.

    The worker loop encodes a message (its arrays are already in shared memory) and
    queues the bytes; this thread writes them in order. The write wakes the trainer, and
    the kernel may then give the trainer this thread's CPU: that costs the thread nothing,
    since it goes back to waiting on its queue, while the loop keeps its CPU and loads the
    next batch. ``None`` on the queue stops the thread; so does a trainer that is gone
    (the loop notices that on its own, in ``receive()``).
    """

    __slots__ = ("_conn", "_queue", "_thread")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="stoker-worker-sender", daemon=True)
        self._thread.start()

    def put(self, payload: bytes) -> None:
        self._queue.put(payload)

    def _run(self) -> None:
        while True:
            payload = self._queue.get()  # the stop check is the None that close() queues
            if payload is None:
                return
            try:
                self._conn.send_bytes(payload)
            except (BrokenPipeError, EOFError, OSError):
                return  # the trainer is gone

    def close(self, timeout_s: float) -> None:
        """Stops the thread once every queued message is written (or ``timeout_s`` passed)."""
        self._queue.put(None)
        self._thread.join(timeout_s)


def _no_slots(index: int) -> object:
    raise AssertionError(f"the worker spec referenced batch slot {index}")


def _set_parent_death_signal() -> None:
    """Linux: the kernel SIGKILLs this worker when the trainer dies, however it dies.

    The kernel sends it when the *thread* that started the worker ends, so the pool
    asks for it only when that thread is the trainer's main thread; workers started
    from another thread rely on the parent check of their loop alone.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_worker_main(
    worker_id: int,
    task_conn: Any,
    result_conn: Any,
    spec: WorkerSpec | None,
    parent_pid: int,
    stack_file: str | None,
    die_with_parent: bool = True,
) -> None:
    """Entry point of a process worker (a ``multiprocessing.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the trainer's SIGTERM handler is not ours
    if die_with_parent:
        _set_parent_death_signal()
    # fork / spawn: our parent is the trainer. forkserver: it is the fork server, so the
    # trainer's own pid is checked as well (the server outlives a killed trainer briefly).
    first_ppid = os.getppid()

    def trainer_gone() -> bool:
        return os.getppid() != first_ppid or (first_ppid != parent_pid and not _pid_exists(parent_pid))

    if trainer_gone():
        return
    try:
        if spec is None:
            spec, _ = transport.decode(task_conn.recv_bytes(), _no_slots)
        if spec.threads is not None:
            cap_threads(spec.threads)
        stack = open(stack_file, "w") if stack_file else None  # noqa: SIM115
        if stack is not None:  # the trainer asks for our stack with SIGUSR1 when we hang
            faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    except BaseException as exc:  # the trainer hears why, instead of guessing from an exit status
        if trainer_gone():
            return
        add_note(exc, "while the worker was starting (receiving the dataset, collate_fn and worker_init_fn)")
        with contextlib.suppress(Exception):
            result_conn.send_bytes(transport.encode(failure(-1, -1, worker_id, exc), None))
        return
    mappings: dict[int, tuple[str, Any]] = {}  # slot index -> (segment name, mmap)
    allocators: dict[int, shm.SlotAllocator] = {}
    sender = _Sender(result_conn)

    def receive() -> Any:
        while not task_conn.poll(_PARENT_POLL_S):
            if trainer_gone():
                return None
        try:
            return task_conn.recv()
        except (EOFError, OSError):
            return None

    def send(message: Any, allocator: shm.SlotAllocator | None) -> None:
        oneoff = None
        if allocator is None and isinstance(message, Done) and spec.segment_prefix is not None:
            nbytes, count = transport.array_bytes(message.batch)
            if nbytes >= transport.SHM_MIN_BATCH_BYTES:
                with contextlib.suppress(OSError):
                    oneoff = shm.OneoffWriter(spec.segment_prefix, nbytes + _ALIGN_SLACK * count)
        try:
            payload = transport.encode(message, allocator or oneoff)
        finally:
            if oneoff is not None:  # its arrays are written: the segment outlives the fd
                oneoff.close()
        sender.put(payload)

    def attach(ref: shm.SlotRef) -> shm.SlotAllocator:
        allocator = allocators.get(ref.index)
        if allocator is None or allocator.ref != ref:
            old = mappings.pop(ref.index, None)
            if old is not None:  # the trainer replaced this slot with a bigger segment
                allocators.pop(ref.index, None)
                with contextlib.suppress(BufferError):
                    old[1].close()
            mapping = shm.attach(ref.name, ref.size)
            mappings[ref.index] = (ref.name, mapping)
            allocator = allocators[ref.index] = shm.SlotAllocator(ref, mapping)
        allocator.reset()
        return allocator

    try:
        run_worker(worker_id, spec, receive, send, attach)
    except KeyboardInterrupt:
        pass
    finally:
        sender.close(_SENDER_FLUSH_TIMEOUT_S)
        allocators.clear()
        for _name, mapping in mappings.values():
            with contextlib.suppress(BufferError):
                mapping.close()
        if stack is not None:
            faulthandler.unregister(signal.SIGUSR1)
            stack.close()
