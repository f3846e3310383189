"""A shuffle buffer for streams: :class:`ShuffleBuffer`, and ``shuffle_buffer=`` of the readers.

A stream cannot be permuted as a whole, so a buffer of ``size`` samples is filled from it;
each step yields a random sample of the buffer and refills its place with the next one.
Every sample of the stream is yielded exactly once per epoch. A sample can come out any
number of places later than in the stream, but at most ``size - 1`` places earlier: the
larger the buffer, the better the mix; a buffer as large as the stream is a full shuffle.

Seeding: an explicit ``seed`` gives the same order for ``(seed, epoch, shard)`` whatever
loader iterates the stream. With ``seed=None`` the buffer draws from the epoch seed of the
:class:`stoker.DataLoader` that iterates it (so ``DataLoader(generator=...)`` or the loader's
seed decides it, as it decides a map-style shuffle), and from ``(0, epoch)`` outside a loader
(the readers' ``shuffle_buffer`` use their own ``seed`` there). Every epoch differs (call
``set_epoch``; the loader does). The *shard* is the ``(rank, worker)`` pair: each worker
buffers its own part of the stream (see :mod:`stoker.sharding`) and the loader interleaves
the workers' outputs, so the order the loader delivers depends on the number of workers and
ranks; only the same seed, epoch, files and topology reproduce an order exactly. The one
exception: ``num_workers=0`` and ``num_workers=1`` read the same single shard with the same
seeds, so they deliver the same order. The *set* of samples per epoch is the same whatever
the topology.

Resuming: ``state_dict()`` stores *positions*, not samples, when the stream is one of
stoker's readers: the position (file index, record index) of the last record read and
those of the records waiting in the buffer, plus the random generator's state. Loading it
re-reads the buffered records (one pass per file, skipping to each one without decoding
the others) and continues the stream after the last record read, so the resumed run yields
exactly what the uninterrupted run would have. Over any other iterable dataset the buffer
stores its samples themselves (they must pickle), plus that dataset's own ``state_dict()``;
over one without ``state_dict`` it keeps no state (a loader replays it). A loader's worker
captures the state after every batch (see :mod:`stoker._state_capture`): positions are
copied, a buffer of samples only marked in a log of its steps, from which its samples at
that mark are rebuilt if the state is asked for. Loading a state checks every entry
(:func:`check_positions_state`) and loads the dataset's own state at once: a damaged or
edited one raises a ``ValueError`` naming the entry, never resumes with other records.
"""

from __future__ import annotations

import array
import collections
import itertools
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from stoker._state_capture import capture, captured, holds_state
from stoker._validate import check_int, check_optional_int, is_int
from stoker.datasets import IterableDataset, is_iterable_dataset
from stoker.engine.random_scopes import current_scope
from stoker.seeding import epoch_rng
from stoker.sharding import current_shard
from stoker.streams._records import (
    STATE_KIND,
    Position,
    RecordStream,
    check_shard,
    check_stream_state,
    state_error,
    state_int,
    state_list,
    state_position,
    state_shard,
)
from stoker.streams._regroup import Delivered, check_marks

__all__ = ["ShuffleBuffer", "check_positions_state"]

_BUFFER_KIND = "stoker.shuffle_buffer"
_NO_PLACE = (-1, -1)  # a sample of a stream that is not a reader has no position
_POSITIONS_KEYS = ("kind", "epoch", "shard", "read", "buffer", "rng")
_SAMPLES_KEYS = ("kind", "epoch", "shard", "samples", "inner", "rng", "ran_out")
_START_ENTRIES = (("epoch", "shard", "an int >= 0"), ("shard", "epoch", "[index, count]"))
_PCG64_BOUND = 2**128  # PCG64's state and increment are 128-bit
_PCG64_KEYS = {"bit_generator", "state", "has_uint32", "uinteger"}


def buffer_rng(seed: int | None, fallback: int, epoch: int, shard: int) -> np.random.Generator:
    """The buffer's generator: ``seed``, else the loader's epoch seed, else ``fallback``."""
    scope = current_scope()
    if seed is not None:
        base = seed
    elif scope is not None:
        base = scope.key  # the epoch seed of the loader (and worker) iterating the stream
    else:
        base = fallback
    return epoch_rng(base, epoch, shard)


def _check_rng_state(owner: str, rng: Any) -> None:
    """Refuses a ``state['rng']`` that is not the state of a PCG64 generator."""
    inner = rng.get("state") if isinstance(rng, Mapping) else None
    if (
        not isinstance(rng, Mapping)
        or set(rng) != _PCG64_KEYS
        or rng["bit_generator"] != "PCG64"
        or not isinstance(inner, Mapping)
        or set(inner) != {"state", "inc"}
        or not all(is_int(v) and 0 <= v < _PCG64_BOUND for v in inner.values())
        or inner["inc"] % 2 == 0  # PCG64 keeps its increment odd
        or rng["has_uint32"] not in (0, 1)
        or not (is_int(rng["uinteger"]) and 0 <= rng["uinteger"] < 2**32)
    ):
        must = (
            "the state of a PCG64 generator (bit_generator 'PCG64', state and an odd inc, "
            "ints in [0, 2**128), has_uint32 0 or 1, uinteger in [0, 2**32))"
        )
        raise state_error(owner, "state['rng']", rng, must)


def _buffered_positions(owner: str, value: Any, files: int, size: int | None) -> list[Position]:
    """``state['buffer']``: distinct positions, no more than the buffer loading it holds."""
    rows = value.tolist() if isinstance(value, np.ndarray) and value.ndim == 2 else value
    rows = state_list(owner, "state['buffer']", rows)
    buffer = [state_position(owner, f"state['buffer'][{k}]", p, files) for k, p in enumerate(rows)]
    first: dict[Position, int] = {}
    for k, position in enumerate(buffer):
        if position in first:
            must = f"a position of its own (state['buffer'][{first[position]}] holds it too)"
            raise state_error(owner, f"state['buffer'][{k}]", position, must)
        first[position] = k
    if len(buffer) > (size or 0):
        into = f"a buffer of {size} records" if size else "a reader without shuffle_buffer"
        must = f"at most {size or 0} positions, as the state is loaded into {into}"
        raise state_error(owner, "state['buffer']", rows, must, got=f"{len(buffer)} positions")
    return buffer


def check_positions_state(owner: str, state: Any, files: int, size: int | None) -> dict[str, Any]:
    """``state`` if it is a whole positions state of a reader of ``files`` files.

    ``size``: the buffer of the reader (or :class:`ShuffleBuffer`) loading it, ``None``
    for none. The checks that need the shard (which records this worker reads) wait for
    the iteration (``RecordStream._check_saved_positions``).

    Raises:
        ValueError: naming the entry that is missing, mistyped or out of range.
    """
    state = check_stream_state(owner, state, STATE_KIND, _POSITIONS_KEYS)
    state["epoch"] = state_int(owner, "state['epoch']", state["epoch"])
    if "delivered" in state:  # records other shards delivered (stoker.streams._regroup)
        state["delivered"] = check_marks(owner, state["delivered"], files)
    if state["shard"] is None and state.get("delivered") is not None:
        for key in ("read", "rng"):  # a regrouped state: nothing read by this shard yet
            if state[key] is not None:
                raise state_error(
                    owner, f"state[{key!r}]", state[key], "None, as state['shard'] is"
                )
        state["buffer"] = np.zeros((0, 2), dtype=np.int64)
        return state
    state["shard"] = state_shard(owner, state["shard"])
    read = state["read"]
    if read is not None:
        read = state_position(owner, "state['read']", read, files)
    buffer = _buffered_positions(owner, state["buffer"], files, size)
    if buffer and read is None:
        must = "a position, as state['buffer'] holds records read"
        raise state_error(owner, "state['read']", read, must)
    if state["rng"] is not None:
        _check_rng_state(owner, state["rng"])
    state["read"] = None if read is None else list(read)
    state["buffer"] = np.asarray(buffer, dtype=np.int64).reshape(-1, 2)
    return state


def _check_samples_state(owner: str, state: Any, size: int) -> dict[str, Any]:
    """``state`` if it is a whole state of a :class:`ShuffleBuffer` that stores its samples."""
    state = check_stream_state(owner, state, _BUFFER_KIND, _SAMPLES_KEYS)
    if state["epoch"] is None and state["shard"] is None:
        return _check_start_state(owner, state)
    for key, other, kind in _START_ENTRIES:
        if state[key] is None:  # (both are None at an epoch's start, one alone never)
            must = f"{kind} while state[{other!r}] is {state[other]!r} (both None: epoch start)"
            raise state_error(owner, f"state[{key!r}]", None, must)
    state["epoch"] = state_int(owner, "state['epoch']", state["epoch"])
    state["shard"] = state_shard(owner, state["shard"])
    samples = state_list(owner, "state['samples']", state["samples"])
    if len(samples) > size:
        must = f"at most {size} samples, as the state is loaded into a buffer of {size}"
        raise state_error(owner, "state['samples']", samples, must, got=f"{len(samples)} samples")
    if state["rng"] is not None:
        _check_rng_state(owner, state["rng"])
    elif samples:
        raise state_error(
            owner, "state['rng']", None, "a generator's state once samples were buffered"
        )
    state["ran_out"] = _state_flag(owner, "state['ran_out']", state["ran_out"])
    return state


def _state_flag(owner: str, entry: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise state_error(owner, entry, value, "True or False")
    return bool(value)


def _check_start_state(owner: str, state: dict[str, Any]) -> dict[str, Any]:
    """A state of an epoch's start (``epoch`` and ``shard`` None, see ``_captured_state``):
    it holds its source's state only, no sample and no generator."""
    samples = state_list(owner, "state['samples']", state["samples"])
    if samples:
        must = "[] in a state of an epoch's start (state['epoch'] and state['shard'] None)"
        raise state_error(owner, "state['samples']", samples, must, got=f"{len(samples)} samples")
    if state["rng"] is not None:
        must = "None in a state of an epoch's start (state['epoch'] and state['shard'] None)"
        raise state_error(owner, "state['rng']", state["rng"], must)
    if _state_flag(owner, "state['ran_out']", state["ran_out"]):
        must = "False in a state of an epoch's start (state['epoch'] and state['shard'] None)"
        raise state_error(owner, "state['ran_out']", True, must)
    state["samples"], state["ran_out"] = [], False
    return state


def _restored_rng(state: Mapping[str, Any]) -> np.random.Generator:
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = dict(state)
    return rng


class _Live:
    """What one iteration holds: buffer, generator, last record read (the state's source)."""

    __slots__ = (
        "buffer", "delivered", "ended", "epoch", "journal", "logged_from", "marks", "places",
        "ran_out", "read", "rng", "shard", "steps",
    )  # fmt: skip

    def __init__(
        self, epoch: int, shard: tuple[int, int], rng: Any, buffer: list[Any], read: Any,
        delivered: list[dict[str, Any]] | None = None,
    ):  # fmt: skip
        self.epoch, self.shard, self.rng, self.buffer, self.read = epoch, shard, rng, buffer, read
        # the buffered records' positions, flat (file, record, file, record, ...) beside the
        # buffer, so a state (captured after every batch a process worker loads) copies one array
        self.places = array.array("q", [v for p, _ in buffer for v in (p or _NO_PLACE)])
        self.ended = False  # the iteration is over: what follows is the next epoch's start
        # the source ran out: the buffer drains, and a state taken now must not read the
        # source again (a stream may rewind itself at its end, its state then its next epoch's)
        self.ran_out = False
        # a regrouped resume's marks: records other shards delivered this epoch (skipped)
        self.delivered = delivered
        self.steps = 0  # samples taken out of the buffer
        # a buffer of samples, while a capture of it lives: each step since the oldest such
        # capture, as (place taken, entry taken, entries refilled), so that a capture is a mark
        # (see _Mark) and the buffer at that mark is rebuilt only when a state is asked for
        self.journal: collections.deque[tuple[int, Any, int]] | None = None
        self.logged_from = 0  # the step the journal's first entry undoes
        self.marks: list[tuple[int, weakref.ref[_Mark]]] = []  # the live marks' steps

    def positions_state(self) -> dict[str, Any]:
        state = {
            "kind": STATE_KIND,
            "epoch": self.epoch,
            "shard": list(self.shard),
            "read": None if self.read is None else list(self.read),
            "buffer": np.frombuffer(self.places, dtype=np.int64).reshape(-1, 2).copy(),
            "rng": None if self.rng is None else self.rng.bit_generator.state,
        }
        if self.delivered is not None:
            state["delivered"] = self.delivered
        return state

    def mark(self, inner: Any) -> _Mark:
        """A capture of this buffer of samples now: O(1), whatever the buffer holds."""
        if self.journal is None:
            self.journal, self.logged_from = collections.deque(), self.steps
        mark = _Mark(
            self, self.steps, self.rng.bit_generator.state, inner, self.epoch, self.shard,
            ran_out=self.ran_out,
        )  # fmt: skip
        self.marks.append((self.steps, weakref.ref(mark, self._forget)))
        self._trim()
        return mark

    def _forget(self, gone: weakref.ref[_Mark]) -> None:
        self.marks = [(step, ref) for step, ref in self.marks if ref is not gone]
        if not self.marks:
            self.journal = None  # no capture left to rebuild: stop logging
        else:
            self._trim()

    def _trim(self) -> None:
        journal, oldest = self.journal, min(step for step, _ in self.marks)
        while journal and self.logged_from < oldest:
            journal.popleft()
            self.logged_from += 1

    def samples_at(self, step: int) -> list[Any]:
        """The buffered samples as they were after ``step`` steps (undoing the later ones)."""
        journal = self.journal
        if journal is None or step < self.logged_from:
            raise AssertionError(f"the shuffle buffer no longer logs back to step {step}")
        buffer = list(self.buffer)
        for j, entry, refills in itertools.islice(reversed(journal), self.steps - step):
            buffer.append(entry)
            buffer[j], buffer[-1] = buffer[-1], buffer[j]
            if refills:
                del buffer[-refills:]
        return [sample for _, sample in buffer]


class _Mark:
    """A capture of a :class:`ShuffleBuffer` over samples: the step it was taken at, the
    generator's state then and its source's capture (and whether that source had run out);
    ``live`` is None at an epoch's start."""

    __slots__ = ("__weakref__", "epoch", "inner", "live", "ran_out", "rng", "shard", "step")

    def __init__(
        self,
        live: _Live | None,
        step: int,
        rng: Any,
        inner: Any,
        epoch: int,
        shard: Any,
        *,
        ran_out: bool = False,
    ) -> None:
        self.live, self.step, self.rng, self.inner = live, step, rng, inner
        self.epoch, self.shard, self.ran_out = epoch, shard, ran_out


def _shuffled(source: Iterator[tuple[Any, Any]], size: int, live: _Live) -> Iterator[Any]:
    """Fill the buffer to ``size``, yield a random entry, repeat; drain it at the end."""
    buffer, places, rng = live.buffer, live.places, live.rng
    while True:
        refills = 0
        while not live.ran_out and len(buffer) < size:
            try:
                entry = next(source)
            except StopIteration:
                live.ran_out = True
            else:
                places.extend(entry[0] or _NO_PLACE)
                buffer.append(entry)
                refills += 1
        if not buffer:
            live.ended = True
            return
        j = int(rng.integers(len(buffer)))
        buffer[j], buffer[-1] = buffer[-1], buffer[j]
        places[2 * j : 2 * j + 2] = places[-2:]  # the last entry moves into the taken one's place
        del places[-2:]
        entry = buffer.pop()
        journal = live.journal
        if journal is not None:
            journal.append((j, entry, refills))
        live.steps += 1
        yield entry[1]


def _positions(state: Mapping[str, Any], name: str) -> list[Position]:
    pairs = np.asarray(state[name], dtype=np.int64).reshape(-1, 2).tolist()
    return [(f, r) for f, r in pairs]


def _start_positioned(
    stream: RecordStream, size: int | None, seed: int | None, epoch: int, resume: Any, owner: str
) -> tuple[_Live, Iterator[Any]]:
    """Starts (or resumes) a position-keyed iteration of a reader, buffered or not."""
    shard = current_shard(rank=stream.rank, world_size=stream.world_size)
    after: Position | None = None
    rng, buffer = None, []
    delivered = None
    if resume is not None and resume.get("delivered"):
        delivered = Delivered(owner, resume["delivered"], stream._record_order())
    if resume is not None and resume["shard"] is not None:
        check_shard(owner, resume, stream.rank, stream.world_size)
        after = None if resume["read"] is None else (int(resume["read"][0]), int(resume["read"][1]))
        if resume.get("rng") is not None:
            rng = _restored_rng(resume["rng"])
        positions = _positions(resume, "buffer")
        stream._check_saved_positions(owner, after, positions)
        buffer = list(zip(positions, stream._read_positions(positions), strict=True))
    if size is not None and rng is None:
        rng = buffer_rng(seed, stream.seed, epoch, shard[0])
    live = _Live(epoch, shard, rng, buffer, after, resume["delivered"] if delivered else None)
    if size is None:
        return live, stream._positioned(after, live, keyed=False, ends=True, delivered=delivered)
    return live, _shuffled(stream._positioned(after, live, delivered=delivered), size, live)


def iterate_reader(reader: RecordStream, resume: Mapping[str, Any] | None) -> Iterator[Any]:
    """A reader's ``__iter__``: position-keyed, through its shuffle buffer if it has one."""
    owner = type(reader).__name__
    reader._live, iterator = _start_positioned(
        reader, reader.shuffle_buffer, None, reader.epoch, resume, owner
    )
    return iterator


def reader_state(reader: RecordStream) -> dict[str, Any]:
    """A reader's ``state_dict()``: its live iteration's, else the state still to be loaded
    (after an iteration ended, an epoch's start: it holds no position)."""
    if reader._live is not None and not reader._live.ended:
        return reader._live.positions_state()
    if reader._resume is not None:
        return dict(reader._resume)
    shard = current_shard(rank=reader.rank, world_size=reader.world_size)
    return _Live(reader.epoch, shard, None, [], None).positions_state()


class ShuffleBuffer(IterableDataset[Any]):
    """Shuffles any iterable dataset through a buffer of ``size`` samples, resumably.

    Each step yields a random sample of the buffer and puts the stream's next sample in
    its place, so every sample is yielded exactly once per epoch. See the module docs for
    what the order depends on and how a state is stored.

    Args:
        dataset: an iterable dataset: one of stoker's readers (its state is then kept as
            record positions) or any other (its samples are stored in the state, and it
            needs ``state_dict`` / ``load_state_dict`` for a mid-epoch state).
        size: the number of samples buffered (memory grows with it).
        seed: fixes the order for ``(seed, epoch, shard)``; ``None`` follows the epoch seed
            of the :class:`stoker.DataLoader` iterating it (0 outside a loader).

    Example:
        >>> from stoker import DataLoader, IterableDataset
        >>> class Numbers(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(10))
        >>> shuffled = ShuffleBuffer(Numbers(), size=4, seed=1)
        >>> sorted(DataLoader(shuffled, batch_size=None)) == list(range(10))
        True
    """

    def __init__(self, dataset: Any, size: int, *, seed: int | None = None) -> None:
        if not is_iterable_dataset(dataset) and not hasattr(dataset, "__iter__"):
            msg = (
                "ShuffleBuffer wraps an iterable dataset (with __iter__), got "
                f"{type(dataset).__name__}"
            )
            raise TypeError(msg)
        self.dataset = dataset
        self.size = check_int("size", size, minimum=1)
        self.seed = check_optional_int("seed", seed)
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        self._live: _Live | None = None

    def _by_position(self) -> bool:
        return isinstance(self.dataset, RecordStream) and self.dataset.shuffle_buffer is None

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration shuffles for (and passes it to the dataset)."""
        self.epoch = check_int("epoch", epoch)
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        if self._by_position():
            self._live, iterator = _start_positioned(
                self.dataset, self.size, self.seed, self.epoch, resume, "ShuffleBuffer"
            )
            return iterator
        rank, world = getattr(self.dataset, "rank", None), getattr(self.dataset, "world_size", None)
        shard = current_shard(rank=rank, world_size=world)
        rng, buffer = None, []
        if resume is not None:  # its inner state was loaded with it
            if resume["shard"] is not None:  # (an epoch's start belongs to no shard)
                check_shard("ShuffleBuffer", resume, rank, world)
            rng = _restored_rng(resume["rng"]) if resume.get("rng") is not None else None
            buffer = [(None, s) for s in resume["samples"]]
        if rng is None:
            rng = buffer_rng(self.seed, 0, self.epoch, shard[0])
        live = self._live = _Live(self.epoch, shard, rng, buffer, None)
        if resume is not None and resume["ran_out"]:  # drains its buffer, reads no more
            live.ran_out = True
            return _shuffled(iter(()), self.size, live)
        source = ((None, s) for s in iter(self.dataset))
        return _shuffled(source, self.size, live)

    def state_dict(self) -> dict[str, Any]:
        """Where the shuffled stream stands, to resume it exactly (see the module docs)."""
        live = self._live
        if (live is None or live.ended) and self._resume is not None:
            return dict(self._resume)
        state = self._captured_state(self._capture_state())
        if state is not None:
            return state
        shard = self._shard()
        if self._by_position():
            return _Live(self.epoch, shard, None, [], None).positions_state()
        return {
            "kind": _BUFFER_KIND, "epoch": self.epoch, "shard": list(shard), "samples": [],
            "inner": None, "rng": None, "ran_out": False,
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue where ``state`` (from :meth:`state_dict`) stood.

        Raises:
            ValueError: ``state`` is not a state of this buffer, or it was damaged or
                edited (the message names the entry and its value).
        """
        if self._by_position():
            files = len(self.dataset._record_order())
            state = check_positions_state("ShuffleBuffer", state, files, self.size)
        else:
            state = _check_samples_state("ShuffleBuffer", state, self.size)
        if state["epoch"] is not None:  # (an epoch's start takes the epoch the loader sets)
            self.set_epoch(state["epoch"])
        if not self._by_position() and state["inner"] is not None:
            load = getattr(self.dataset, "load_state_dict", None)
            if not callable(load):
                must = f"None: {type(self.dataset).__name__} has no load_state_dict"
                raise state_error("ShuffleBuffer", "state['inner']", state["inner"], must)
            load(state["inner"])
        self._resume = state

    # -- cheap captures (stoker._state_capture) ------------------------------------------
    def _shard(self) -> tuple[int, int]:
        rank, world = getattr(self.dataset, "rank", None), getattr(self.dataset, "world_size", None)
        return current_shard(rank=rank, world_size=world)

    def _saves_state(self) -> bool:
        return self._by_position() or holds_state(self.dataset)

    def _capture_state(self) -> Any:
        """Positions (a few bytes per buffered record), or a mark in the buffer's log of its
        steps: a capture costs the same whatever the buffer holds. None at an epoch's start
        over a reader; over another stream, its source's own capture then."""
        live = self._live
        running = live is not None and not live.ended
        if self._by_position():
            return live.positions_state() if running else None  # type: ignore[union-attr]
        if not holds_state(self.dataset):
            if not running:
                return None
            msg = (
                f"ShuffleBuffer cannot save a mid-epoch state: {type(self.dataset).__name__} has "
                "no state_dict / load_state_dict to resume its stream from. Give it those "
                "methods, or save at an epoch boundary."
            )
            raise TypeError(msg)
        inner = capture(self.dataset)
        if running:
            return live.mark(inner)  # type: ignore[union-attr]
        return None if inner is None else _Mark(None, 0, None, inner, self.epoch, None)

    def _captured_state(self, snapshot: Any) -> dict[str, Any] | None:
        if snapshot is None or snapshot.__class__ is not _Mark:
            return snapshot  # positions: already a state
        live = snapshot.live
        return {
            "kind": _BUFFER_KIND,
            # an epoch's start (no live iteration) takes the epoch the loader sets
            "epoch": snapshot.epoch if live is not None else None,
            "shard": list(snapshot.shard) if live is not None else None,
            "samples": live.samples_at(snapshot.step) if live is not None else [],
            "inner": captured(self.dataset, snapshot.inner),
            "rng": snapshot.rng,
            "ran_out": snapshot.ran_out,
        }

    def __repr__(self) -> str:
        return f"ShuffleBuffer({self.dataset!r}, size={self.size}, seed={self.seed})"
