"""Every message that crosses between the trainer and a worker.

Trainer -> worker: :class:`WorkerSpec` (once), :class:`StartEpoch`, :class:`Task`,
:class:`StateRequest` (an iterable dataset's ``state_dict()``), and ``None`` to stop. Worker
-> trainer: :class:`Ready`, :class:`Done`, :class:`Exhausted`, :class:`Failed` (a task
failed), :class:`StartupFailed` (the worker could not start), :class:`StreamState` (the
answer to a :class:`StateRequest`). :class:`Undelivered` never crosses: the trainer makes
it when an answer cannot be read. Messages are frozen dataclasses, built with keywords.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker._errors import WorkerError
from stoker.engine.slots import SlotRef

__all__ = [
    "Done",
    "Exhausted",
    "Failed",
    "Failure",
    "Initialised",
    "Ready",
    "StartEpoch",
    "StartupFailed",
    "StateRequest",
    "StreamState",
    "Task",
    "Undelivered",
    "WorkerSpec",
    "add_note",
    "rebuild_error",
]


def add_note(error: BaseException, note: str) -> None:
    """Attaches ``note`` to ``error`` (shown under its traceback); Python 3.10 has no add_note."""
    try:
        error.add_note(note)
    except AttributeError:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]  # type: ignore[attr-defined]


def _reduce(self: Any) -> tuple[Any, tuple[Any, ...]]:
    """Pickles a message as (class, field values): several times faster than the generic
    dataclass state protocol, which looks its fields up on every message."""
    return type(self), tuple([getattr(self, name) for name in self.__slots__])


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to start: sent once (pickled once for spawn/forkserver)."""

    dataset: Any
    iterable: bool
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    batch_size: int | None
    drop_last: bool
    worker_init_fn: Callable[[int], None] | None
    num_workers: int
    threads: int | None
    skip_errors: bool  # on_error="skip": leave failing samples out of their batch
    segment_prefix: str | None  # process workers: where one-off segments are created

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class StartEpoch:
    """Sets the epoch and seed; an iterable dataset's worker restarts its stream.

    ``stream_state``: a resumed epoch's state of this worker's stream (what a
    :class:`StreamState` answered for the last batch of it the consumer received), which it
    opens its stream from (see :class:`stoker.engine.fetch.IterableFetcher`).

    ``boot``: sent by ``iter(loader)`` to workers it starts, with the epoch and seed it
    expects, so that ``worker_init_fn`` runs (and fails) there, as torch's does. The
    epoch's own StartEpoch follows at its first ``next()``; if it has the same epoch and
    seed, the worker, already seeded, only takes its stream state.
    """

    epoch: int
    seed: int
    stream_state: Any = None
    boot: bool = False

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Task:
    """Load one batch: ``indices`` for map-style datasets, ``None`` for the next stream batch.

    ``batch_index`` (the batch's place in the epoch) and ``position`` (its first sample's)
    key the random scopes, so augmentations do not depend on the worker. ``keep_from``
    (iterable datasets): the worker may drop the captures of its stream's state taken
    before its ``keep_from``-th task of the epoch (the trainer will not ask for them).
    ``threads``: how many threads load the batch's samples at once (a thread pool's first
    batch, see :mod:`stoker.engine.head_start`; 1 otherwise).
    """

    task_id: int
    epoch: int
    indices: Any
    slot: SlotRef | None
    batch_index: int
    position: int
    keep_from: int = 0
    threads: int = 1

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class StateRequest:
    """Asks for the state of the worker's stream after its ``after``-th task of ``epoch``.

    ``after=0``: before its first task (the state its stream opened from, or for an epoch
    the worker has not started, what its dataset holds now). Answered with a
    :class:`StreamState` of the same ``request_id``.
    """

    request_id: int
    epoch: int
    after: int

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class StreamState:
    """A worker's answer to a :class:`StateRequest`: its stream's state, or why it has none.

    ``state``: ``{"dataset", "iterator", "taken", "ended", "replay"}`` (see
    :mod:`stoker.engine.stream_state`), or None when ``failure`` says what raised.
    """

    request_id: int
    worker_id: int
    state: Any
    failure: Failure | None = None

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker process is up (its spec loaded): the staggered start may go on."""

    worker_id: int
    pid: int

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Initialised:
    """A worker ran ``worker_init_fn`` (once per process): a later death is no start-up failure."""

    worker_id: int

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Done:
    """A loaded batch; ``overflow`` bytes did not fit the slot (the trainer grows it)."""

    task_id: int
    epoch: int
    worker_id: int
    batch: Any
    nbytes: int
    overflow: int
    shards: bool = True  # False: an iterable dataset never asked get_worker_info()
    skipped: tuple[Any, ...] = ()  # SkippedSample records (on_error="skip")
    empty: bool = False  # every sample was skipped: no batch
    fetch_s: float = 0.0  # stage times in the worker (see stoker.profiling.stats)
    collate_s: float = 0.0
    slow: tuple[Any, ...] = ()  # (seconds, index) of its slowest samples, STOKER_PROFILE_SAMPLES=1
    idle_s: float = 0.0  # time the worker waited for work since its previous answer (autotuning)
    # the worker could not map the task's slot ("OSError: ..."): the batch came without it
    slot_error: str = ""

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Exhausted:
    """This worker's copy of an iterable dataset has no more batches this epoch."""

    task_id: int
    epoch: int
    worker_id: int

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception on its way to the trainer: pickled when it can be, described always."""

    pid: int
    exception: bytes | None  # the pickled exception, None when it cannot be rebuilt
    type_name: str
    text: str
    traceback: str

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Failed:
    """Loading the batch of ``task_id`` raised (the dataset, collate_fn, or sending it)."""

    task_id: int
    epoch: int
    worker_id: int
    failure: Failure

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class StartupFailed:
    """The worker could not start: receiving its spec, worker_init_fn or set_epoch raised."""

    worker_id: int
    failure: Failure

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class Undelivered:
    """Trainer side only: a worker's answer for ``task_id`` arrived but could not be read.

    Its arrays could not be mapped (out of file descriptors, a segment gone): that batch's
    error, raised where the batch would have been, not a dead worker.
    """

    task_id: int
    epoch: int
    worker_id: int
    error: BaseException


def rebuild_error(failure: Failure, worker_id: int, where: str, pid: int | None) -> BaseException:
    """The worker's exception, rebuilt (or a WorkerError describing it), with its story noted."""
    error: BaseException | None = None
    if failure.exception is not None:
        try:
            error = pickle.loads(failure.exception)
        except Exception:
            error = None
    if error is None:
        error = WorkerError(f"{failure.type_name}: {failure.text}")
    pid_text = f" (pid {pid if pid is not None else failure.pid})" if failure.pid else ""
    note = (
        f"Raised in stoker worker {worker_id}{pid_text} {where}.\n"
        f"Worker traceback (most recent call last):\n{_strip_header(failure.traceback)}"
    )
    with contextlib.suppress(AttributeError):  # an exception type with __slots__
        error.stoker_worker_id = worker_id  # type: ignore[attr-defined]
    add_note(error, note)
    return error


def _strip_header(text: str) -> str:
    header = "Traceback (most recent call last):\n"
    return text[len(header) :] if text.startswith(header) else text
