"""Where an iterable dataset's streams stand, and how the trainer learns it when asked.

NOTE [ Stream states ]
----------------------
Each shard of a stream (the main process with ``num_workers=0``, each worker otherwise)
opens its stream from a *state* (:class:`~stoker.engine.fetch.IterableFetcher`)::

    {"dataset": the dataset's state_dict() (None when the dataset is its own iterator),
     "iterator": the state_dict() of what iter(dataset) returned,
     "taken": samples the stream had drawn this epoch (its random scopes' positions),
     "ended": the stream had run out (its epoch has nothing left),
     "replay": neither holds a state: the stream is drawn again up to "taken", and dropped}

Restored in this order: the dataset's state, ``iter(dataset)``, the iterator's state.

A worker captures that state after every task it runs (:class:`StreamCaptures`; a capture is
cheap, see :mod:`stoker._state_capture`) and keeps the captures the trainer may still ask
for: each :class:`~stoker.engine.messages.Task` says from which of its tasks on
(``keep_from``), given the batches delivered and the deliveries ``state_dict()`` may take
back (a pinning thread's read-ahead). Nothing crosses per batch. ``loader.state_dict()``
sends each worker a :class:`~stoker.engine.messages.StateRequest` for the state after the
last of its batches the consumer received (:func:`ask_workers`); the worker answers with a
:class:`~stoker.engine.messages.StreamState` as soon as it reads the request (before the
tasks queued ahead of it), so the trainer waits at most about one batch. Meanwhile it
receives and buffers the other answers as usual. A worker that does not answer within
``STATE_REQUEST_TIMEOUT_S`` is named in a ``WorkerError``.

An epoch closed mid-way (``break``, an abandoned iterator) asks its workers once more
before they stop and keeps the answers, so a ``state_dict()`` after it still resumes where
the consumer stopped. So does an epoch that ends while a pinning thread may still hold some
of its batches and whose workers stop with it: it asks them for the states before each of
those batches (``Progress.taken_back_streams``; every stream has ended, so such a state holds
at most those batches' samples).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

from stoker._errors import WorkerError
from stoker._state_capture import capture, captured, holds_state
from stoker.engine.messages import Failure, StateRequest, StreamState

__all__ = [
    "STATE_REQUEST_TIMEOUT_S",
    "StreamCaptures",
    "ask_workers",
    "start_state",
]

STATE_REQUEST_TIMEOUT_S = 120.0  # a worker answers once its current batch is loaded
_POLL_S = 1.0
_request_ids = itertools.count()


def start_state(dataset: Any) -> dict[str, Any] | None:
    """The state of a stream not opened yet: what its dataset holds now (None: nothing)."""
    if not holds_state(dataset):
        return None
    state = captured(dataset, capture(dataset))
    if state is None:
        return None
    return {"dataset": state, "iterator": None, "taken": 0, "ended": False, "replay": False}


class _Failed:
    """A capture that raised: the failure is the answer if that capture is asked for."""

    __slots__ = ("failure",)

    def __init__(self, failure: Failure) -> None:
        self.failure = failure


class StreamCaptures:
    """A worker's captures of its stream's state this epoch, by the tasks done before each.

    ``0`` is the stream as it opened; ``k`` the stream after the worker's ``k``-th task.
    """

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[int, Any] = {}

    def clear(self) -> None:
        self._kept.clear()

    def add(self, done: int, snapshot: Any) -> None:
        self._kept[done] = snapshot

    def failed(self, done: int, failure: Failure) -> None:
        self._kept[done] = _Failed(failure)

    def keep_from(self, done: int) -> None:
        """Drops the captures taken before the ``done``-th task (nobody will ask for them)."""
        kept = self._kept
        if kept and min(kept) < done:
            for key in [k for k in kept if k < done]:
                del kept[key]

    def get(self, done: int) -> Any:
        """The capture after the ``done``-th task; a :class:`Failure` if taking it raised."""
        if done not in self._kept:
            msg = (
                f"the worker holds no capture of its stream after its task {done} of this "
                f"epoch; it holds those after tasks {sorted(self._kept)}"
            )
            raise AssertionError(msg)
        snapshot = self._kept[done]
        return snapshot.failure if snapshot.__class__ is _Failed else snapshot


def ask_workers(
    pool: Any,
    requests: Mapping[int, tuple[int, int]],
    *,
    receive: Callable[[int, Any, set[int]], None],
    on_death: Callable[[Any], None],
    timeout_s: float | None = None,
) -> dict[int, StreamState]:
    """Asks each worker ``w`` of ``requests`` for its stream's state ``(epoch, after)``.

    Every other message that arrives meanwhile goes to ``receive``, every death to
    ``on_death`` (which may raise). Returns the answers by worker id.

    Raises:
        WorkerError: a worker is gone, or did not answer within ``timeout_s``
            (default ``STATE_REQUEST_TIMEOUT_S``); the message names it.
    """
    timeout_s = STATE_REQUEST_TIMEOUT_S if timeout_s is None else timeout_s
    request_id = next(_request_ids)
    for worker_id, (epoch, after) in requests.items():
        if not pool.send(worker_id, StateRequest(request_id=request_id, epoch=epoch, after=after)):
            msg = (
                f"state_dict() could not ask worker {worker_id} for its stream's state: the "
                "worker is gone"
            )
            raise WorkerError(msg)
    answers: dict[int, StreamState] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < len(requests):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(requests) - set(answers))
            who = ", ".join(_who(pool, w) for w in missing)
            msg = (
                f"state_dict() waited {timeout_s:g} s for the stream state of worker {who}, "
                "which did not answer: it is still loading a batch, or stuck in its dataset's "
                "state_dict(). A worker answers once its current batch is loaded."
            )
            raise WorkerError(msg)
        messages, deaths = pool.poll(min(remaining, _POLL_S))
        for worker_id, message, leased in messages:
            if message.__class__ is StreamState:
                if message.request_id == request_id:
                    answers[worker_id] = message
                continue  # a late answer to an earlier request
            receive(worker_id, message, leased)
        for death in deaths:
            on_death(death)
            if death.worker_id in requests and death.worker_id not in answers:
                msg = (
                    f"worker {death.worker_id} died before it sent its stream's state for "
                    f"state_dict(): {death.describe()}"
                )
                raise WorkerError(msg)
    return answers


def _who(pool: Any, worker_id: int) -> str:
    pid = pool.pid(worker_id)
    return f"{worker_id} (pid {pid})" if pid is not None else str(worker_id)
