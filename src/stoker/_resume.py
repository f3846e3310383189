"""Resume state: what ``DataLoader.state_dict()`` is made of and how it is checked.

The loader owns the epoch counter. At the start of every epoch it tells the sampler
(``set_epoch``; stoker's samplers also advance by themselves) and records the sampler's
and generator's state *before* anything draws from them. While the epoch runs, the
iterator counts the batches it has handed out. A state is therefore small and needs no
buffered batch: ``{epoch, batches handed out, seeds, the sampler's epoch-start state}``.
Restoring it re-creates the epoch's index order and skips the batches already handed out
without loading them.
"""

from __future__ import annotations

import base64
import binascii
import collections
import itertools
import random
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._validate import is_int

__all__ = [
    "STATE_VERSION",
    "Progress",
    "check_state",
    "draws_unrecorded",
    "epoch_owner",
    "global_generators",
    "mid_epoch_state",
    "restore_global_generators",
    "skip_batches",
]

STATE_VERSION = 1
_RECENT = 256  # deliveries remembered, for a pinning thread's read-ahead (at most a few)


@dataclass(slots=True)
class Progress:
    """Where the current epoch stands; shared by the loader and its live iterator.

    Delivered batches are recorded by their place in the epoch: every batch before
    ``floor`` was delivered, and so were those in ``ahead`` (batches that came out of order,
    with ``in_order=False``). In order, ``ahead`` stays empty and ``floor == yielded``.
    """

    epoch: int
    seed: int
    start: dict[str, Any] = field(default_factory=dict)
    yielded: int = 0  # batches handed out (or skipped) this epoch, whatever their places
    done: bool = False  # the engine has handed out the epoch's last batch (or ended it)
    finished: bool = False  # the user's iterator raised StopIteration: the next state is the
    # next epoch's start; until then a state after the last batch is this epoch's end
    samples: int = 0  # an iterable dataset's samples drawn this epoch (its random positions)
    floor: int = 0
    ahead: set[int] = field(default_factory=set)
    recent: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=_RECENT)
    )
    # An iterable dataset read by workers: for each worker, how many of its tasks of the epoch
    # it had run when the last batch of it handed out came (its stream's state then is what
    # a state asks it for: see stoker.engine.stream_state), the worker whose batch comes next
    # in the rotation, and what to undo to take deliveries back. Small ints, whatever the
    # stream. ``resume_streams``: the states the streams open from (a resumed epoch), by
    # worker (0 without workers).
    streams: dict[int, int] = field(default_factory=dict)
    next_worker: int = 0
    resume_streams: dict[int, Any] = field(default_factory=dict)
    recent_streams: collections.deque[tuple[int, int | None, int]] = field(
        default_factory=lambda: collections.deque(maxlen=_RECENT)
    )
    # the epoch's engine closed before its end: the stream states it collected on the way
    # out, ``(streams, next_worker)``, or the error collecting them raised. The lock orders
    # that with a state_dict() asking the live engine (a pinning thread may close it).
    kept_streams: Any = None
    # the epoch ended and its workers stopped while a pinning thread held ``h`` of its
    # batches: by ``h``, the ``(streams, next_worker)`` a state taking them back needs (or
    # the error collecting them raised); asked before the workers stopped
    taken_back_streams: Any = None
    stream_lock: threading.RLock = field(default_factory=threading.RLock)

    def deliver(self, batch_index: int) -> None:
        """Records that the batch at ``batch_index`` was handed out."""
        self.yielded += 1
        self.recent.append(batch_index)
        if batch_index == self.floor:
            self.floor += 1
            while self.floor in self.ahead:
                self.ahead.discard(self.floor)
                self.floor += 1
        elif batch_index > self.floor:
            self.ahead.add(batch_index)

    def deliver_stream(self, worker_id: int, done: int, num_workers: int) -> None:
        """Records that a batch of ``worker_id``'s stream, its ``done``-th task, was handed out."""
        self.recent_streams.append((worker_id, self.streams.get(worker_id), self.next_worker))
        self.streams[worker_id] = done
        self.next_worker = (worker_id + 1) % num_workers

    def stream_resumable(self, held: int = 0) -> tuple[dict[int, int], int]:
        """``(streams, next_worker)`` as if the last ``held`` deliveries had not happened."""
        streams, next_worker = dict(self.streams), self.next_worker
        undo = list(self.recent_streams)[len(self.recent_streams) - held :] if held else []
        for worker_id, before, next_before in reversed(undo):
            if before is None:
                streams.pop(worker_id, None)
            else:
                streams[worker_id] = before
            next_worker = next_before
        return streams, next_worker

    def resumable(self, held: int = 0) -> tuple[int, list[int]]:
        """``(floor, ahead)`` as if the last ``held`` deliveries had not happened.

        A state saved from it resumes at ``floor`` and skips the batches in ``ahead``:
        exact for out-of-order delivery too. ``held`` are batches a pinning thread took
        but the loop has not received.
        """
        if held > len(self.recent):
            raise AssertionError(
                f"cannot take back {held} deliveries, only {len(self.recent)} are remembered"
            )
        taken_back = set(list(self.recent)[len(self.recent) - held :]) if held else set()
        floor = min([self.floor, *(b for b in taken_back if b < self.floor)])
        ahead = (set(range(floor, self.floor)) | self.ahead) - taken_back
        return floor, sorted(ahead)


def _nested_samplers(index_sampler: Any) -> Iterator[Any]:
    """``index_sampler``, the sampler it wraps (a batch sampler's ``sampler``), and so on."""
    sampler, seen = index_sampler, set()
    while sampler is not None and id(sampler) not in seen:  # a sampler wrapping itself ends it
        seen.add(id(sampler))
        yield sampler
        sampler = getattr(sampler, "sampler", None)


def _has_state(sampler: Any) -> bool:
    return callable(getattr(sampler, "state_dict", None))


def draws_unrecorded(index_sampler: Any) -> bool:
    """Whether the epoch's order may come from draws no sampler state records.

    True for a sampler without ``state_dict`` (torch's ``RandomSampler`` without a
    generator draws its seed from torch's global generator when its epoch starts), and for a
    batch sampler over one. Such an order is reproduced by replaying the sampler under the
    global generators' states of its epoch's start (:func:`global_generators`).
    """
    for sampler in _nested_samplers(index_sampler):
        if not _has_state(sampler):
            return not isinstance(sampler, (list, tuple, range))
    return False


def _stateless_sampler_generator(index_sampler: Any) -> Any:
    """The ``generator`` of a sampler without state in ``index_sampler`` (torch's samplers
    keep one), or ``None``."""
    for sampler in _nested_samplers(index_sampler):
        generator = getattr(sampler, "generator", None)
        if not _has_state(sampler) and callable(getattr(generator, "get_state", None)):
            return generator  # a torch.Generator
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def global_generators(index_sampler: Any) -> dict[str, Any]:
    """The states of the generators a sampler without state may draw from: the global ones
    (numpy's, random's, torch's) and its own ``generator`` (a torch.Generator).

    Plain values (strings and numbers, the big ones base64-encoded), so a loader state
    stays JSON-serialisable.
    """
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    states: dict[str, Any] = {
        "numpy": [_b64(np.asarray(keys, dtype="<u4").tobytes()), int(pos), int(has_gauss), gauss],
        "python": [version, _b64(np.asarray(internal, dtype="<u4").tobytes()), python_gauss],
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = _b64(torch.get_rng_state().numpy().tobytes())
    own = _stateless_sampler_generator(index_sampler)
    if own is not None:
        states["sampler"] = _b64(own.get_state().numpy().tobytes())
    return states


def _torch_state(text: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(_unb64(text)), dtype=torch.uint8)


def restore_global_generators(states: Mapping[str, Any], index_sampler: Any) -> None:
    """Puts the generators back as :func:`global_generators` found them.

    Raises:
        ValueError: a state does not fit its generator (the loader state was edited, or the
            sampler has no generator of its own where the saved one had).
    """
    try:
        keys, pos, has_gauss, gauss = states["numpy"]
        np.random.set_state(
            ("MT19937", np.frombuffer(_unb64(keys), dtype="<u4"), pos, has_gauss, gauss)
        )
        version, internal, python_gauss = states["python"]
        internal = tuple(int(v) for v in np.frombuffer(_unb64(internal), dtype="<u4"))
        random.setstate((version, internal, python_gauss))
        if "torch" in states:
            import torch

            torch.set_rng_state(_torch_state(states["torch"]))
        if "sampler" in states:
            own = _stateless_sampler_generator(index_sampler)
            if own is None:
                raise TypeError("this loader's sampler has no torch.Generator of its own")
            own.set_state(_torch_state(states["sampler"]))
    except (KeyError, TypeError, ValueError, RuntimeError, binascii.Error) as exc:
        msg = (
            "the loader state's 'globals' entry does not hold the global generators' states "
            f"it was saved with ({type(exc).__name__}: {exc}); pass what state_dict() "
            "returned, unedited"
        )
        raise ValueError(msg) from None


def epoch_owner(index_sampler: Any) -> Any:
    """The sampler that takes ``set_epoch``: the index sampler or the one it wraps."""
    for candidate in (index_sampler, getattr(index_sampler, "sampler", None)):
        if (
            candidate is not None
            and callable(getattr(candidate, "set_epoch", None))
            and hasattr(candidate, "epoch")
        ):
            return candidate
    return None


def skip_batches(index_sampler: Any, skip: int, batched: bool) -> tuple[Iterator[Any], int]:
    """An iterator over the epoch's index batches from batch ``skip`` on.

    Returns it with the number of samples the skipped batches held (their positions).
    A BatchSampler over a stoker sampler slices instead of iterating.
    """
    iter_from = getattr(index_sampler, "iter_from", None)
    if skip and iter_from is not None:
        return iter_from(skip), skip * index_sampler.batch_size
    iterator = iter(index_sampler)
    if not skip:
        return iterator, 0
    skipped = list(itertools.islice(iterator, skip))
    positions = sum(len(batch) for batch in skipped) if batched else len(skipped)
    return iterator, positions


def mid_epoch_state(progress: Progress, held: int) -> dict[str, Any]:
    """The part of a state that places a loader inside ``progress``'s epoch.

    The sampler's and generator's states are those recorded when the epoch started;
    ``held`` deliveries are taken back (see :meth:`Progress.resumable`).
    """
    floor, ahead = progress.resumable(held)
    state: dict[str, Any] = {"epoch": progress.epoch, "batches": floor}
    if ahead:
        state["ahead"] = ahead  # delivered out of order beyond ``batches``: skipped on resume
    state["sampler"] = progress.start.get("sampler")
    state["generator"] = progress.start.get("generator")
    state["torch_draw"] = progress.start.get("torch_draw", True)
    if "globals" in progress.start:
        state["globals"] = progress.start["globals"]  # as the epoch's sampler found them
    return state


def check_state(state: object, index_sampler: object) -> dict[str, Any]:
    """``state`` as a plain dict, after checking it can resume a loader over ``index_sampler``.

    Every entry the loader reads is checked here, before anything is restored, so a damaged
    or edited state fails at ``load_state_dict`` with the entry and its value, never later
    with a confusing error or, worse, with other data.

    Raises:
        ValueError: ``state`` was not made by ``DataLoader.state_dict()`` of this version,
            lacks an entry, holds an entry of the wrong kind or out of range, or holds a
            sampler state this loader's sampler cannot load.
    """
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, Mapping) else type(state).__name__
        msg = (
            f"load_state_dict expects a dict made by DataLoader.state_dict() (version "
            f"{STATE_VERSION}), got {got!r}"
        )
        raise ValueError(msg)
    for key in ("epoch", "batches", "seed"):
        if key not in state:
            msg = f"the loader state has no {key!r} entry; pass what state_dict() returned"
            raise ValueError(msg)
    _check_entries(state)
    out = dict(state)
    if "workers" in state:
        out["workers"] = _checked_workers(state["workers"])
    if "stream" in state and not isinstance(state["stream"], Mapping):
        _refuse("stream", state["stream"], "the stream's state (a dict)")
    if state.get("sampler") is not None and not callable(
        getattr(index_sampler, "load_state_dict", None)
    ):
        msg = (
            f"the state holds a sampler state but this loader's {type(index_sampler).__name__} "
            "has no load_state_dict; build the loader with the same kind of sampler"
        )
        raise ValueError(msg)
    return out


def _check_entries(state: Mapping[str, Any]) -> None:
    """Refuses an entry of the wrong kind or out of range, naming it and its value."""
    for key in ("epoch", "batches"):
        _check_entry(key, state[key], minimum=0)
    if state["seed"] is not None:
        _check_entry("seed", state["seed"], minimum=0)
    ahead = state.get("ahead", ())
    if not isinstance(ahead, (list, tuple)):
        _refuse("ahead", ahead, "a list of the batch numbers delivered beyond 'batches'")
    for batch in ahead:
        _check_entry("ahead", batch, minimum=state["batches"] + 1, whole=ahead)
    if len(set(ahead)) != len(ahead):
        _refuse("ahead", ahead, "batch numbers without repeats")
    for key in ("drew_seed", "torch_draw"):
        if key in state and not isinstance(state[key], bool):
            _refuse(key, state[key], "True or False")
    if "globals" in state and not (
        isinstance(state["globals"], Mapping) and {"numpy", "python"} <= set(state["globals"])
    ):
        _refuse("globals", state["globals"], "the global generators' states")
    if state.get("torch_seed") is not None:
        _check_entry("torch_seed", state["torch_seed"], minimum=0)
        _check_entry("torch_seed_epoch", state.get("torch_seed_epoch"), minimum=0)
    if "samples" in state:
        _check_entry("samples", state["samples"], minimum=0)


def _checked_workers(workers: object) -> dict[str, Any]:
    """The ``workers`` entry of a stream's state, its worker ids as ints again.

    JSON writes a dict's int keys as strings: a state that went through ``json`` comes back
    with ``"0"``, ``"1"``, ..., which must still find their workers' streams.
    """
    if not isinstance(workers, Mapping) or not {"num_workers", "streams", "next"} <= set(workers):
        _refuse("workers", workers, "a dict of 'num_workers', 'streams' and 'next'")
    count = workers["num_workers"]  # type: ignore[index]
    _check_entry("workers", count, minimum=1, whole=workers)
    if not is_int(workers["next"]) or not 0 <= workers["next"] < count:  # type: ignore[index]
        _refuse("workers", workers, f"a dict whose 'next' is a worker id below {count}")
    streams = workers["streams"]  # type: ignore[index]
    if not isinstance(streams, Mapping):
        _refuse("workers", workers, "a dict whose 'streams' maps worker ids to their streams")
    checked: dict[int, Any] = {}
    for key, stream in streams.items():
        worker = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(worker, bool) or not is_int(worker) or not 0 <= worker < count:
            _refuse("workers", workers, f"a dict whose 'streams' keys are worker ids below {count}")
        if int(worker) in checked or not isinstance(stream, Mapping):
            _refuse("workers", workers, "a dict that maps each worker id once to its stream")
        checked[int(worker)] = stream
    return {**workers, "streams": checked}


def _refuse(key: str, value: object, expected: str) -> None:
    msg = (
        f"the loader state's {key!r} entry must be {expected}, got {value!r}; "
        "pass what state_dict() returned, unedited"
    )
    raise ValueError(msg)


def _check_entry(key: str, value: object, *, minimum: int, whole: object = None) -> None:
    """Refuses ``value`` unless it is an int ``>= minimum`` (a bool is not a count)."""
    if isinstance(value, bool) or not is_int(value) or value < minimum:  # type: ignore[operator]
        kind = "a non-negative int" if minimum == 0 else f"an int of at least {minimum}"
        _refuse(key, value if whole is None else whole, kind)
