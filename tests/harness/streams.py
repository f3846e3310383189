"""Streams that hold their place in each of the ways a resumable stream can, and a round trip.

Every stream here splits ``range(n)`` between the workers reading it (worker ``w`` of ``W``
reads ``w, w + W, ...``) and tags each sample with a draw from numpy's global generator,
which stoker seeds per sample: a resumed run must draw the same values as the
uninterrupted one. They differ in where their place is kept:

* :class:`EpochCounting`: the dataset's own ``state_dict`` (position and epoch), loaded
  before ``iter()``; it counts its epochs itself and tags its samples with them;
* :class:`OwnIterator`: the dataset is its own iterator and sets its place in ``__iter__``,
  so its state can only be loaded after ``iter()`` (before it, ``load_state_dict`` raises
  AttributeError);
* :class:`SelfIterating`: its own iterator, which ``__iter__`` does not rewind: after an
  epoch it stays at its end unless a state moves it back;
* :class:`StatefulIterator`: no state on the dataset; ``__iter__`` returns an iterator that
  has ``state_dict`` / ``load_state_dict``;
* :class:`BothStates`: the dataset counts its epochs, its iterator keeps the position;
* :class:`Stateless`: neither the dataset nor its iterator has a state (a generator).

``round_trip(make_loader, stop_after)`` runs a loader through its epochs, runs it again up
to ``stop_after`` batches, takes ``state_dict()``, resumes a new loader from it and returns
``(whole, head, rest, state)``: ``head + rest`` must equal ``whole``, batch for batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from harness.save_load import to_plain
from stoker import IterableDataset, get_worker_info

__all__ = [
    "BothStates",
    "EpochCounting",
    "OwnIterator",
    "SelfIterating",
    "StatefulIterator",
    "Stateless",
    "batches_of",
    "round_trip",
    "shard",
]


def shard(n: int) -> range:
    """This worker's part of ``range(n)``: every W-th value from its id."""
    info = get_worker_info()
    if info is None:
        return range(n)
    return range(info.id, n, info.num_workers)


def sample(value: int, epoch: int = 0) -> dict[str, Any]:
    return {"value": value, "epoch": epoch, "noise": float(np.random.rand())}


class EpochCounting(IterableDataset):
    """Its state is its own (``{"taken", "epoch"}``); it counts its epochs itself."""

    def __init__(self, n: int = 100) -> None:
        self.n = n
        self.epoch = 0
        self.taken = 0
        self.resume_at: int | None = None
        self.iterations = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.iterations += 1
        skip, self.resume_at = (self.resume_at or 0), None
        self.taken = skip
        for value in list(shard(self.n))[skip:]:
            self.taken += 1
            yield sample(value, self.epoch)
        self.taken = 0  # what a state taken after the end resumes from: the next epoch
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at, self.epoch = state["taken"], state["epoch"]


class _Cursor:
    __slots__ = ("at", "end", "step")

    def __init__(self, at: int, end: int, step: int) -> None:
        self.at, self.end, self.step = at, end, step


class OwnIterator(IterableDataset):
    """Its own iterator: ``__iter__`` sets its place, ``load_state_dict`` moves it."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self) -> OwnIterator:
        part = shard(self.n)
        self.cursor = _Cursor(part.start, part.stop, part.step)
        return self

    def __next__(self) -> dict[str, Any]:
        cursor = self.cursor
        if cursor.at >= cursor.end:
            raise StopIteration
        value, cursor.at = cursor.at, cursor.at + cursor.step
        return sample(value)

    def state_dict(self) -> dict[str, int]:
        return {"at": self.cursor.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor.at = state["at"]  # AttributeError before __iter__ set the cursor


class SelfIterating(IterableDataset):
    """Its own iterator, not rewound by ``__iter__``: only a loaded state moves it."""

    def __init__(self, n: int = 100) -> None:
        self.n = n
        self.at = 0

    def __iter__(self) -> SelfIterating:
        return self

    def __next__(self) -> dict[str, Any]:
        part = shard(self.n)
        if self.at >= len(part):
            raise StopIteration
        self.at += 1
        return sample(part[self.at - 1])

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


class _Position:
    """A stateful iterator over a range, as a dataset's ``__iter__`` may return."""

    def __init__(
        self, values: range, epoch: int = 0, on_end: Callable[[], None] | None = None
    ) -> None:
        self.values, self.at, self.epoch, self.on_end = values, 0, epoch, on_end

    def __iter__(self) -> _Position:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.at >= len(self.values):
            if self.on_end is not None:
                self.on_end()
                self.on_end = None
            raise StopIteration
        self.at += 1
        return sample(self.values[self.at - 1], self.epoch)

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


class StatefulIterator(IterableDataset):
    """No state of its own: ``__iter__`` returns an iterator that keeps its place."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self) -> _Position:
        return _Position(shard(self.n))


class BothStates(IterableDataset):
    """The dataset counts the epochs it ran to their end; its iterator keeps the position."""

    def __init__(self, n: int = 100) -> None:
        self.n = n
        self.epoch = 0

    def __iter__(self) -> _Position:
        return _Position(shard(self.n), self.epoch, on_end=self._ended)

    def _ended(self) -> None:
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]


class Stateless(IterableDataset):
    """A generator: nothing can say where it stands."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for value in shard(self.n):
            yield sample(value)


def batches_of(loader: Any, epochs: int = 1) -> list[Any]:
    """Every batch of ``epochs`` epochs, as plain values."""
    return [to_plain(batch) for _ in range(epochs) for batch in loader]


def round_trip(
    make_loader: Callable[[], Any], stop_after: int, *, epochs: int = 1
) -> tuple[list[Any], list[Any], list[Any], dict[str, Any]]:
    """``(whole, head, rest, state)``: the uninterrupted run, the batches before the state,
    those of a new loader resumed from it (the rest of the ``epochs`` epochs)."""
    reference = make_loader()
    whole = batches_of(reference, epochs)
    reference.close()
    first = make_loader()
    head: list[Any] = []
    state: dict[str, Any] | None = None
    for epoch in range(epochs):
        iterator = iter(first)
        for batch in iterator:
            head.append(to_plain(batch))
            if len(head) == stop_after:
                state = first.state_dict()
                break
        if state is not None:
            iterator.close()
            resumed_in = epoch
            break
    first.close()
    if state is None:
        raise AssertionError(f"stop_after={stop_after} is past the end ({len(head)} batches)")
    resumed = make_loader()
    resumed.load_state_dict(state)
    rest = batches_of(resumed, epochs - resumed_in)
    resumed.close()
    return whole, head, rest, state
