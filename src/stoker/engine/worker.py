"""The worker loop, shared by process and thread workers.

A worker receives a :class:`~stoker.engine.messages.WorkerSpec` once, then a stream of
:class:`StartEpoch` and :class:`Task` messages; it fetches through the same fetchers as
the main process, collates (into a shared-memory slot for process workers) and reports
:class:`Done`, :class:`Exhausted` or :class:`Failed`. ``None`` stops it. A process worker
also stops when its parent disappears. Over an iterable dataset it also captures its
stream's state after every task and answers :class:`StateRequest` messages with it, ahead
of the tasks queued before them (see NOTE [ Stream states ] in
:mod:`stoker.engine.stream_state`).

A process worker hands its encoded answers to a :class:`_Sender` thread, which writes them
to the trainer, and goes straight on to its next task. Writing them from the loop itself
cost short batches up to half their throughput on a busy machine: a pipe write that wakes
a waiting reader tells the kernel that the writer is about to sleep, so the trainer takes
the worker's CPU and the worker, which is not going to sleep, waits in the run queue
behind every other runnable process (see docs/engine.md, "Hand-offs").

Seeds, in torch's order: at its first :class:`StartEpoch` a worker learns its seed (the
epoch's base seed + its id, derived in :mod:`stoker.seeding`), seeds the global generators
with it (process workers), sets its :class:`~stoker.WorkerInfo`, and only then runs
``worker_init_fn``. The global generators ``worker_init_fn`` seeds are left to it from
then on (see ``random_scopes.leave_to_user``): not reseeded at later epochs, not served
from per-sample scopes.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from time import perf_counter
from typing import Any

from stoker._proc import pid_exists
from stoker._worker_info import WorkerInfo, WorkerRNG, _consulted, _set_worker_info
from stoker.collate import collate_into
from stoker.engine import random_scopes, segments, slots, transport
from stoker.engine.fetch import AllSkipped, IterableFetcher, MapFetcher
from stoker.engine.messages import (
    Done,
    Exhausted,
    Failed,
    Failure,
    Initialised,
    Ready,
    StartEpoch,
    StartupFailed,
    StateRequest,
    StreamState,
    Task,
    WorkerSpec,
    add_note,
)
from stoker.engine.stream_state import StreamCaptures, start_state
from stoker.seeding import _seed_worker_globals, _worker_seed

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


def run_worker_init_fn(spec: WorkerSpec, info: WorkerInfo, owns_process: bool) -> frozenset[str]:
    """Runs ``worker_init_fn``; returns the global generators it seeded, now left to it.

    In a process worker those generators stop being served from per-sample scopes (the
    user's seed wins, as with torch). A thread worker shares the trainer's generators,
    so seeding them there changes nothing for loading, and stoker says so.
    """
    if spec.worker_init_fn is None:
        return frozenset()
    torch_was_loaded = "torch" in sys.modules
    with random_scopes.seeding_watch() as seeded:
        spec.worker_init_fn(info.id)
    if not owns_process:
        if seeded:
            names = [_GENERATOR_NAMES[g] for g in random_scopes.GENERATORS if g in seeded]
            what = " and ".join(names) + (
                " global generators" if len(names) > 1 else " global generator"
            )
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
            _seed_worker_globals(info.seed, skip=frozenset({"numpy", "python"}))
        _set_worker_info(info, owns_process=True)  # torch's get_worker_info answers too
    left = frozenset(seeded)
    random_scopes.leave_to_user(left)
    return left


def describe_failure(exc: BaseException) -> Failure:
    """``exc`` as it travels to the trainer: pickled when it can be rebuilt, described always."""
    try:
        blob: bytes | None = pickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        blob = None
    return Failure(
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
    send: Callable[[Any, slots.SlotAllocator | None], None],
    attach: Callable[[slots.SlotRef], slots.SlotAllocator] | None,
    seed_globals: bool = True,
    receive_ready: Callable[[], list[Any]] | None = None,
    *,
    stopped: Callable[[], bool] | None = None,
) -> None:
    """The loop itself. ``receive()`` returns the next message (``None`` to stop).

    ``seed_globals``: the worker owns its process, so it may seed the global RNGs and set
    process-wide state (process workers; a thread worker shares both with the trainer).
    ``receive_ready()``: the messages that have already arrived, without waiting; before
    each task of an iterable dataset the loop reads them, to answer state requests queued
    behind tasks at once. ``stopped()``: the pool is shutting down (thread workers, which
    cannot be killed): the loop ends before its next message, dropping the tasks queued.
    """
    loop = _WorkerLoop(worker_id, spec, send, attach, seed_globals)
    send(Ready(worker_id=worker_id, pid=os.getpid()), None)
    inbox: collections.deque[Any] = collections.deque()
    read_ahead = receive_ready if spec.iterable else None
    while True:
        if inbox:
            message = inbox.popleft()
        else:
            waiting = perf_counter()
            message = receive()
            loop.idle += perf_counter() - waiting
        if message is None or (stopped is not None and stopped()):
            return
        if isinstance(message, StartEpoch):
            if not loop.start_epoch(message):
                return
        elif isinstance(message, StateRequest):
            loop.answer_state(message)
        else:
            if read_ahead is not None:
                inbox.extend(read_ahead())
                _answer_requests_ahead(loop, inbox)
            loop.run_task(message)


def _answer_requests_ahead(loop: _WorkerLoop, inbox: collections.deque[Any]) -> None:
    """Answers the state requests among the tasks at the head of ``inbox`` (not past a
    message that changes the epoch): they ask about tasks already done."""
    kept: list[Any] = []
    while inbox and isinstance(inbox[0], (Task, StateRequest)):
        message = inbox.popleft()
        if isinstance(message, StateRequest):
            loop.answer_state(message)
        else:
            kept.append(message)
    inbox.extendleft(reversed(kept))


class _WorkerLoop:
    """One worker's state between messages: its epoch, seed, fetcher and idle time."""

    def __init__(
        self,
        worker_id: int,
        spec: WorkerSpec,
        send: Callable[[Any, slots.SlotAllocator | None], None],
        attach: Callable[[slots.SlotRef], slots.SlotAllocator] | None,
        seed_globals: bool,
    ) -> None:
        self.worker_id, self.spec, self.send, self.attach = worker_id, spec, send, attach
        self.seed_globals = seed_globals
        self.method = "multiprocessing" if seed_globals else "thread"
        self.epoch, self.epoch_seed = -1, 0
        self.fetcher: MapFetcher | IterableFetcher | None = None
        self.initialised = False  # worker_init_fn runs at the first StartEpoch, once seeded
        self.booted: tuple[int, int] | None = None  # (epoch, seed) of a boot StartEpoch
        self.left_to_user: frozenset[str] = frozenset()
        self.idle = 0.0  # time spent waiting for work since the last answer (autotuning)
        # an iterable dataset: the state a resumed epoch's stream opens from, the captures of
        # its state after each task of the epoch, and how many tasks of the epoch are done
        self.resume_stream: Any = None
        self.captures = StreamCaptures()
        self.tasks_done = 0

    def start_epoch(self, message: StartEpoch) -> bool:
        """Seeds the worker for the epoch (worker_init_fn the first time); False: it failed."""
        spec, worker_id = self.spec, self.worker_id
        booted, self.booted = self.booted, (message.epoch, message.seed) if message.boot else None
        if booted == (message.epoch, message.seed) and not message.boot:
            # iter() started this epoch already: seeded, worker_init_fn run, set_epoch told
            self.resume_stream = message.stream_state
            return True
        self.epoch, self.epoch_seed = message.epoch, message.seed
        seed = _worker_seed(message.seed, worker_id)
        rng = None if self.seed_globals else WorkerRNG.seeded(seed)
        info = WorkerInfo(
            id=worker_id, num_workers=spec.num_workers, seed=seed, dataset=spec.dataset, rng=rng,
            worker_method=self.method,
        )  # fmt: skip
        _set_worker_info(info, owns_process=self.seed_globals)
        if self.seed_globals:
            _seed_worker_globals(seed, skip=self.left_to_user)
        try:
            if not self.initialised:
                self.initialised = True
                self.left_to_user = run_worker_init_fn(spec, info, self.seed_globals)
                self.send(Initialised(worker_id=worker_id), None)
            set_epoch = getattr(spec.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(message.epoch)
        except BaseException as exc:
            self.send(StartupFailed(worker_id=worker_id, failure=describe_failure(exc)), None)
            return False
        self.fetcher = None
        self.resume_stream = message.stream_state  # opened, in torchdata's order, at the 1st task
        self.captures.clear()
        self.tasks_done = 0
        return True

    def run_task(self, task: Task) -> None:
        """Loads the task's batch (into its slot) and answers: Done, Exhausted or Failed."""
        allocator, slot_error = None, ""
        if self.attach is not None and task.slot is not None:
            try:
                allocator = self.attach(task.slot)
            except OSError as exc:
                # Out of file descriptors or address space: the batch travels through the pipe
                # instead (slower, nothing lost), and the trainer says why.
                slot_error = f"{type(exc).__name__}: {exc}"
        try:
            self._load_and_answer(task, allocator, slot_error)
        finally:
            if self.spec.iterable:  # the stream's state now, for a state_dict()
                self.tasks_done += 1
                self.captures.keep_from(task.keep_from)
                self._capture(self.tasks_done)

    def _load_and_answer(
        self, task: Task, allocator: slots.SlotAllocator | None, slot_error: str
    ) -> None:
        try:
            batch = self._fetch(task, allocator)
        except StopIteration:
            self.send(
                Exhausted(task_id=task.task_id, epoch=self.epoch, worker_id=self.worker_id), None
            )
            return
        except AllSkipped:
            skipped = self.fetcher.take_skipped()  # type: ignore[union-attr]
            self._answer(task, None, None, skipped=skipped, empty=True)
            return
        except BaseException as exc:
            self._fail(task, exc)
            return
        try:
            self._answer(task, batch, allocator, slot_error=slot_error)
        except (
            Exception
        ) as exc:  # the answer cannot be encoded: that batch's error, not the worker's end
            add_note(
                exc,
                "stoker could not send this batch to the trainer: a process worker pickles what "
                "collate_fn returns (its numpy arrays and tensors travel through shared memory)",
            )
            self._fail(task, exc)

    def _capture(self, done: int) -> None:
        """Captures the stream's state after ``done`` tasks; a capture that raises is kept as
        the failure to answer if that state is asked for."""
        if not isinstance(self.fetcher, IterableFetcher):
            return  # the stream did not open: a request for this state reports why again
        try:
            self.captures.add(done, self.fetcher.capture())
        except Exception as exc:
            self.captures.failed(done, describe_failure(exc))

    def answer_state(self, request: StateRequest) -> None:
        """Answers a :class:`StateRequest` with the stream's state, or what raised."""
        state, failure = None, None
        try:
            state = self._stream_state(request)
            if isinstance(state, Failure):
                state, failure = None, state
        except Exception as exc:
            failure = describe_failure(exc)
        answer = StreamState(
            request_id=request.request_id, worker_id=self.worker_id, state=state, failure=failure
        )
        self.send(answer, None)

    def _stream_state(self, request: StateRequest) -> Any:
        fetcher = self.fetcher
        if request.epoch != self.epoch or not isinstance(fetcher, IterableFetcher):
            # a stream that has not opened (this epoch, or the next one): where it will start
            if request.epoch == self.epoch and self.resume_stream is not None:
                return self.resume_stream
            try:
                return start_state(self.spec.dataset)
            except Exception:  # a state_dict() that needs a running iteration: none before it
                return None
        snapshot = self.captures.get(request.after)
        return snapshot if isinstance(snapshot, Failure) else fetcher.state_of(snapshot)

    def _fetch(self, task: Task, allocator: slots.SlotAllocator | None) -> Any:
        spec = self.spec
        if self.fetcher is None:
            self.fetcher = (
                IterableFetcher(
                    spec.dataset,
                    spec.batch_size,
                    spec.collate_fn,
                    spec.drop_last,
                    _worker_seed(self.epoch_seed, self.worker_id),
                    resume=self.resume_stream,
                )
                if spec.iterable
                else MapFetcher(
                    spec.dataset, spec.auto_collation, spec.collate_fn, spec.skip_errors
                )
            )
            if spec.iterable:
                self._capture(0)
        with collate_into(allocator) if allocator is not None else contextlib.nullcontext():
            if spec.iterable:
                return self.fetcher.fetch(task.batch_index)  # type: ignore[call-arg]
            # worker_init_fn may have set up this thread for its samples: no helpers then
            threads = task.threads if spec.worker_init_fn is None else 1
            return self.fetcher.fetch(
                task.indices, self.epoch_seed, task.batch_index, task.position, threads
            )  # type: ignore[call-arg]

    def _answer(
        self,
        task: Task,
        batch: Any,
        allocator: slots.SlotAllocator | None,
        *,
        skipped: tuple = (),
        empty: bool = False,
        slot_error: str = "",
    ) -> None:
        fetcher = self.fetcher
        stages: dict[str, Any] = {}
        if isinstance(fetcher, MapFetcher) and not empty:
            skipped = fetcher.take_skipped()
            stages = {
                "fetch_s": fetcher.fetch_s,
                "collate_s": fetcher.collate_s,
                "slow": fetcher.slow_samples,
            }
        done = Done(
            task_id=task.task_id,
            epoch=self.epoch,
            worker_id=self.worker_id,
            batch=batch,
            nbytes=allocator.used if allocator is not None else 0,
            overflow=allocator.overflow if allocator is not None else 0,
            shards=not self.spec.iterable or _consulted(),
            skipped=skipped,
            empty=empty,
            idle_s=self.idle,
            slot_error=slot_error,
            **stages,
        )
        self.idle = 0.0
        self.send(done, allocator)

    def _fail(self, task: Task, exc: BaseException) -> None:
        failed = Failed(
            task_id=task.task_id,
            epoch=self.epoch,
            worker_id=self.worker_id,
            failure=describe_failure(exc),
        )
        self.send(failed, None)


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
        self._queue: queue.SimpleQueue[bytes | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="stoker-worker-sender", daemon=True)
        self._thread.start()

    def put(self, payload: bytes) -> None:
        self._queue.put(payload)

    def _run(self) -> None:
        while True:
            payload = self._queue.get()  # the stop check is the None that close() queues
            if payload is None:
                return
            if payload.__class__ is threading.Event:  # flush(): every earlier message is written
                payload.set()  # type: ignore[union-attr]
                continue
            try:
                self._conn.send_bytes(payload)
            except (BrokenPipeError, EOFError, OSError):
                return  # the trainer is gone

    def flush(self, timeout_s: float) -> None:
        """Returns once every message queued so far is written (or ``timeout_s`` passed)."""
        written = threading.Event()
        self._queue.put(written)
        written.wait(timeout_s)

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
        return os.getppid() != first_ppid or (
            first_ppid != parent_pid and not pid_exists(parent_pid)
        )

    if trainer_gone():
        return
    stack = None
    try:
        # first of all, so that a worker stuck while starting still shows where: kept open for
        # the worker's life, faulthandler writes to it when the trainer sends SIGUSR1
        stack = open(stack_file, "w") if stack_file else None  # noqa: SIM115
        if stack is not None:
            faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
        if spec is None:
            spec, _ = transport.decode(task_conn.recv_bytes(), _no_slots)
        if spec.threads is not None:
            cap_threads(spec.threads)
    except BaseException as exc:  # the trainer hears why, instead of guessing from an exit status
        if not trainer_gone():
            _report_startup_failure(worker_id, exc, result_conn)
        return
    ends = _ProcessEnds(task_conn, result_conn, spec.segment_prefix, trainer_gone)
    try:
        run_worker(
            worker_id, spec, ends.receive, ends.send, ends.attach, receive_ready=ends.receive_ready
        )
    except KeyboardInterrupt:
        pass
    finally:
        ends.close()
        if stack is not None:
            faulthandler.unregister(signal.SIGUSR1)
            stack.close()


def _report_startup_failure(worker_id: int, exc: BaseException, result_conn: Any) -> None:
    add_note(
        exc,
        "while the worker was starting (receiving the dataset, collate_fn and worker_init_fn)",
    )
    with contextlib.suppress(Exception):
        failed = StartupFailed(worker_id=worker_id, failure=describe_failure(exc))
        result_conn.send_bytes(transport.encode(failed, None))


class _ProcessEnds:
    """A process worker's ends of its pipes and its mappings of the trainer's slots."""

    def __init__(
        self,
        task_conn: Any,
        result_conn: Any,
        segment_prefix: str | None,
        trainer_gone: Callable[[], bool],
    ) -> None:
        self._task_conn = task_conn
        self._segment_prefix = segment_prefix
        self._trainer_gone = trainer_gone
        self._sender = _Sender(result_conn)
        self._mappings: dict[int, tuple[str, Any]] = {}  # slot index -> (segment name, mmap)
        self._allocators: dict[int, slots.SlotAllocator] = {}

    def receive(self) -> Any:
        """The trainer's next message; None once it is gone or hung up."""
        while not self._task_conn.poll(_PARENT_POLL_S):
            if self._trainer_gone():
                return None
        try:
            return self._task_conn.recv()
        except (EOFError, OSError):
            return None

    def receive_ready(self) -> list[Any]:
        """The trainer's messages that have already arrived, without waiting."""
        ready = []
        try:
            while self._task_conn.poll(0):
                ready.append(self._task_conn.recv())
        except (EOFError, OSError):
            ready.append(None)  # the trainer hung up: stop after these
        return ready

    def send(self, message: Any, allocator: slots.SlotAllocator | None) -> None:
        """Sends an answer; a batch without a slot goes through a one-off segment if large."""
        oneoff = None
        if allocator is None and isinstance(message, Done) and self._segment_prefix is not None:
            nbytes, count = transport.array_bytes(message.batch)
            if nbytes >= transport.SHM_MIN_BATCH_BYTES:
                with contextlib.suppress(OSError):
                    oneoff = slots.OneoffWriter(self._segment_prefix, nbytes + _ALIGN_SLACK * count)
        try:
            payload = transport.encode(message, allocator or oneoff)
        finally:
            if oneoff is not None:  # its arrays are written: the segment outlives the fd
                oneoff.close()
        self._sender.put(payload)
        if message.__class__ is Initialised:  # must reach the trainer even if we die next
            self._sender.flush(_SENDER_FLUSH_TIMEOUT_S)

    def attach(self, ref: slots.SlotRef) -> slots.SlotAllocator:
        """An allocator writing into the slot ``ref`` names (mapped once, remapped if replaced)."""
        allocator = self._allocators.get(ref.index)
        if allocator is None or allocator.ref != ref:
            old = self._mappings.pop(ref.index, None)
            if old is not None:  # the trainer replaced this slot with a bigger segment
                self._allocators.pop(ref.index, None)
                with contextlib.suppress(BufferError):
                    old[1].close()
            mapping = segments.attach(ref.name, ref.size)
            self._mappings[ref.index] = (ref.name, mapping)
            allocator = self._allocators[ref.index] = slots.SlotAllocator(ref, mapping)
        allocator.reset()
        return allocator

    def close(self) -> None:
        """Flushes what is still being sent and unmaps every slot."""
        self._sender.close(_SENDER_FLUSH_TIMEOUT_S)
        self._allocators.clear()
        for _name, mapping in self._mappings.values():
            with contextlib.suppress(BufferError):
                mapping.close()
