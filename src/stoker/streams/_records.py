"""Record positions of the file readers, so a stream can resume and re-read exactly.

A record's *position* is ``(file index, record index)``: the file's index in the reader's
file list and the record's 0-based place among that file's records (before sharding
keeps every ``k``-th of a shared file). :class:`RecordStream` is the part of
:class:`~stoker.formats.text.TextLines`, :class:`~stoker.formats.text.JsonLines` and
:class:`~stoker.formats.tar.TarShards` that reads by positions: it yields
``(position, sample)`` pairs, resumes after a position (skipping within the file, never
delivering a record twice), re-reads a given set of positions, and keeps the reader's
``state_dict`` / ``load_state_dict`` and its ``shuffle_buffer``.

A reader provides three hooks: ``_record_order()`` (the file indices in the epoch's
order), ``_open_records(i)`` (the raw records of file ``i``) and ``_finish_record(raw)``
(the sample, or the reader's ``_skip_marker`` for a bad record it skips).

Loading a state checks it: a state that was damaged or edited raises a ``ValueError``
naming the entry and its value (:func:`state_error`) before anything is read, never
delivers other records. What needs the shard (which files and records this worker
reads) is checked when the iteration starts, and a read position past the end of its
file when the stream gets there.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._validate import check_optional_int, is_int
from stoker.engine.random_scopes import current_scope
from stoker.sharding import Shard, current_shard, shard_for_worker

__all__ = [
    "Position",
    "RecordStream",
    "check_shard",
    "check_stream_state",
    "damaged",
    "state_error",
    "state_int",
    "state_list",
    "state_position",
    "state_shard",
]

Position = tuple[int, int]
STATE_KIND = "stoker.stream"
_POSITION_BOUND = 2**63  # positions are stored as int64
_SHOWN_CHARS = 160  # a value in an error message is cut to this many characters


def _closing(records: Iterable[Any]) -> None:
    close = getattr(records, "close", None)
    if close is not None:
        close()


def damaged(owner: str) -> str:
    """The advice that ends every message about a damaged or edited state."""
    return f"the state is damaged or was edited; load one that {owner}.state_dict() saved"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def state_error(
    owner: str, entry: str, value: Any, must: str, *, got: str | None = None
) -> ValueError:
    """The error of a damaged or edited state: ``entry`` (``"state['read']"``) and its value.

    ``got`` words what was found instead of the value's ``repr``.

    Example:
        >>> str(state_error("JsonLines", "state['epoch']", -1, "an int >= 0"))[:68]
        "JsonLines.load_state_dict: state['epoch'] must be an int >= 0, got -1"
    """
    msg = (
        f"{owner}.load_state_dict: {entry} must be {must}, got {got or _shown(value)} "
        f"({damaged(owner)})"
    )
    return ValueError(msg)


def state_int(owner: str, entry: str, value: Any, *, maximum: int | None = None) -> int:
    """``value`` as an int if it is one in ``[0, maximum]``; else :func:`state_error`."""
    if not is_int(value) or value < 0 or (maximum is not None and value > maximum):
        must = "an int >= 0" if maximum is None else f"an int in [0, {maximum}]"
        raise state_error(owner, entry, value, must)
    return int(value)


def state_position(owner: str, entry: str, value: Any, files: int) -> Position:
    """``value`` as a ``(file, record)`` position of one of ``files`` files."""
    pair = value.tolist() if isinstance(value, np.ndarray) else value
    if (
        not isinstance(pair, (list, tuple))
        or len(pair) != 2
        or not all(is_int(v) and 0 <= v < _POSITION_BOUND for v in pair)
        or pair[0] >= files
    ):
        must = f"[file, record]: ints in [0, 2**63), the file in [0, {files - 1}] ({files} files)"
        raise state_error(owner, entry, value, must)
    return int(pair[0]), int(pair[1])


def state_list(owner: str, entry: str, value: Any, length: int | None = None) -> list[Any]:
    """``value`` as a list if it is a list, tuple or 1-D array (of ``length`` items)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        must = "a list" if length is None else f"a list of {length} items"
        raise state_error(owner, entry, value, must)
    if length is not None and len(value) != length:
        must = f"a list of {length} items"
        raise state_error(owner, entry, value, must, got=f"a list of {len(value)}")
    return list(value)


def state_shard(owner: str, value: Any) -> list[int]:
    """``state['shard']``, ``[index, count]`` with ``0 <= index < count``."""
    pair = state_list(owner, "state['shard']", value, 2)
    count = pair[1]
    if not is_int(count) or count < 1 or not is_int(pair[0]) or not 0 <= pair[0] < count:
        raise state_error(
            owner, "state['shard']", value, "[index, count], ints with 0 <= index < count"
        )
    return [int(pair[0]), int(count)]


def check_stream_state(
    owner: str, state: Any, kind: str, keys: Sequence[str] = ()
) -> dict[str, Any]:
    """``state`` as a dict if it is a state of ``kind`` holding every entry of ``keys``."""
    if not isinstance(state, Mapping) or state.get("kind") != kind:
        got = (
            f"one whose 'kind' is {state.get('kind')!r}"
            if isinstance(state, Mapping)
            else f"a {type(state).__name__}: {_shown(state)}"
        )
        msg = (
            f"{owner}.load_state_dict expects a state saved by {owner}.state_dict(), whose "
            f"'kind' is {kind!r}; got {got}"
        )
        raise ValueError(msg)
    missing = [key for key in keys if key not in state]
    if missing:
        msg = f"{owner}.load_state_dict: the state has no {missing[0]!r} entry ({damaged(owner)})"
        raise ValueError(msg)
    return dict(state)


def check_shard(
    owner: str, state: Mapping[str, Any], rank: int | None, world_size: int | None
) -> None:
    """Refuses a state saved by another (rank, worker) shard: its positions belong to that one."""
    shard = list(current_shard(rank=rank, world_size=world_size))
    if list(state["shard"]) != shard:
        msg = (
            f"{owner}: this state was saved by shard {state['shard'][0]} of {state['shard'][1]} "
            f"(rank x worker, state['shard']), and is loaded in shard {shard[0]} of {shard[1]}; "
            "resume with the same numbers of ranks and workers, each loading its own state"
        )
        raise ValueError(msg)


class _Cursor:
    __slots__ = ("read",)


class RecordStream:
    """Reading by record positions; mixed into the file readers (see the module docs)."""

    _skip_marker: Any = None
    shuffle_buffer: int | None = None
    epoch: int = 0
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None

    def _init_stream(self, shuffle_buffer: int | None) -> None:
        self.shuffle_buffer = check_optional_int("shuffle_buffer", shuffle_buffer, minimum=1)
        self._resume: dict[str, Any] | None = None
        self._live: Any = None

    # -- hooks the reader defines ----------------------------------------------------
    def _record_order(self) -> list[int]:
        raise NotImplementedError

    def _open_records(self, file_index: int, local: Any = None) -> Iterable[Any]:
        raise NotImplementedError

    def _finish_record(self, raw: Any) -> Any:
        raise NotImplementedError

    def _opened_files(self, order: list[int], first: int = 0) -> Any:
        """A context giving ``_open_records`` its ``local`` copies of remote files (or None).

        ``order``: the epoch's file order; ``first``: how many of this shard's files a
        resumed stream has consumed (they are not downloaded again).
        """
        return contextlib.nullcontext()

    # -- reading by positions ----------------------------------------------------------
    def _positioned(
        self,
        after: Position | None = None,
        live: Any = None,
        keyed: bool = True,
        ends: bool = False,
        delivered: Container[Position] | None = None,
    ) -> Iterator[Any]:
        """``(position, sample)`` of this shard's records, starting after ``after``.

        With ``live``, each record's position is also set as ``live.read`` before it is
        yielded; with ``keyed=False`` the samples come alone (one generator, no pairs);
        ``ends``: this is the whole stream, and ``live.ended`` is set once it has run out.
        ``delivered``: positions delivered by other shards this epoch (a regrouped resume),
        passed over unread.
        """
        order = self._record_order()
        shard = self._shard(order)
        items, stride = shard.items, shard.record_stride
        start_k = 0 if after is None else items.index(after[0])  # checked when resumed
        skip = self._skip_marker
        live = _Cursor() if live is None else live
        with self._opened_files(order, start_k) as local:
            for k in range(start_k, len(items)):
                file_index = items[k]
                records = self._open_records(file_index, local)
                try:
                    rows: Iterator[tuple[int, Any]] = enumerate(records)
                    if k == start_k and after is not None:
                        if next(itertools.islice(rows, after[1], None), None) is None:
                            self._read_past_the_end(after)
                        rows = itertools.islice(rows, stride - 1, None, stride)
                    else:
                        rows = itertools.islice(rows, shard.record_offset, None, stride)
                    for r, raw in rows:
                        if delivered is not None and (file_index, r) in delivered:
                            continue
                        value = self._finish_at(raw, file_index, r)
                        if value is not skip:
                            live.read = position = (file_index, r)
                            yield (position, value) if keyed else value
                finally:
                    _closing(records)
        if ends:
            live.ended = True

    def _shard(self, order: list[int]) -> Shard[int]:
        return shard_for_worker(order, rank=self.rank, world_size=self.world_size)

    def _read_past_the_end(self, read: Position) -> None:
        msg = (
            f"{type(self).__name__}: state['read'] is record {read[1]} of file {read[0]}, past "
            "the end of that file; the files changed since the state was saved, or it was "
            "edited: resume with the files it was saved with"
        )
        raise ValueError(msg)

    def _check_saved_positions(
        self, owner: str, read: Position | None, buffered: Sequence[Position]
    ) -> None:
        """Refuses saved positions this shard cannot have read before: another shard's
        records, or buffered records that come after the last one read."""
        shard = self._shard(self._record_order())
        place = {f: k for k, f in enumerate(shard.items)}

        def stream_place(entry: str, position: Position) -> tuple[int, int]:
            f, r = position
            offset, stride = shard.record_offset, shard.record_stride
            if f not in place or r < offset or (r - offset) % stride:
                msg = (
                    f"{owner}: {entry} is record {r} of file {f}, which this shard (shard "
                    f"{shard.index} of {shard.count}, rank x worker) does not read in epoch "
                    f"{self.epoch}: it reads files {shard.items}, every record {offset}, "
                    f"{offset} + {stride}, ... of each; resume with the same files, epoch and "
                    "topology the state was saved with"
                )
                raise ValueError(msg)
            return place[f], r

        if read is None:
            return
        last = stream_place("state['read']", read)
        for k, position in enumerate(buffered):
            if stream_place(f"state['buffer'][{k}]", position) > last:
                msg = (
                    f"{owner}: state['buffer'][{k}] is record {position[1]} of file "
                    f"{position[0]}, which comes after state['read'] (record {read[1]} of file "
                    f"{read[0]}): a buffered record was read before it ({damaged(owner)})"
                )
                raise ValueError(msg)

    def _finish_at(self, raw: Any, file_index: int, record: int) -> Any:
        """The sample of ``raw``, its random draws keyed by its position in the files.

        Inside a loader, global random draws in ``transform`` are seeded from the epoch
        seed and the record's ``(file, record)`` position, not from when it was read: a
        record read ahead into a shuffle buffer, or read again on resume, draws the same.
        """
        scope = current_scope()
        if scope is None:
            return self._finish_record(raw)
        saved = scope.position, scope.index
        scope.position, scope.index = -2, (file_index, record)
        try:
            return self._finish_record(raw)
        finally:
            scope.position, scope.index = saved

    def _read_positions(self, positions: Sequence[Position]) -> list[Any]:
        """The samples at ``positions``, in order, reading each file once up to its last one."""
        wanted: dict[int, set[int]] = {}
        for f, r in positions:
            wanted.setdefault(f, set()).add(r)
        found: dict[Position, Any] = {}
        with self._opened_files([], 0) as local:  # each file fetched as it is needed
            for f, rs in wanted.items():
                records = self._open_records(f, local)
                last = max(rs)
                try:
                    for r, raw in enumerate(records):
                        if r in rs:
                            found[f, r] = self._finish_at(raw, f, r)
                        if r >= last:
                            break
                finally:
                    _closing(records)
        missing = [p for p in positions if p not in found or found[p] is self._skip_marker]
        if missing:
            msg = (
                f"{type(self).__name__}: cannot re-read the record(s) at (file, record) "
                f"{missing[:4]} that state['buffer'] holds: past the end of the file or a record "
                "it skips; the files changed since the state was saved, or it was edited"
            )
            raise ValueError(msg)
        return [found[p] for p in positions]

    # -- iteration and state -------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_live"] = None  # a running iteration stays with the process that runs it
        return state

    def __iter__(self) -> Iterator[Any]:
        from stoker.streams.shuffle import iterate_reader

        resume, self._resume = self._resume, None
        return iterate_reader(self, resume)

    def state_dict(self) -> dict[str, Any]:
        """Where this reader's stream stands (positions only, no sample), to resume exactly.

        Holds the epoch, the (rank, worker) shard, the position of the last record read
        and, with ``shuffle_buffer``, the positions of the buffered records and the
        buffer's random state. Each worker's copy has its own state.
        """
        from stoker.streams.shuffle import reader_state

        return reader_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue where ``state`` (from :meth:`state_dict`) stood.

        Raises:
            ValueError: ``state`` is not a state of this reader, or it was damaged or
                edited (the message names the entry and its value).
        """
        from stoker.streams.shuffle import check_positions_state

        files = len(self._record_order())
        state = check_positions_state(type(self).__name__, state, files, self.shuffle_buffer)
        self.epoch = state["epoch"]
        self._resume = state

    def _regrouped_state(
        self, streams: Mapping[int, tuple[Mapping[str, Any] | None, bool]], num_workers: int
    ) -> dict[str, Any]:
        """The state every worker of a loader with another worker count opens from: the
        records the old ``num_workers`` workers' streams delivered, to skip (each old
        worker's state and whether its stream ended; see :mod:`stoker.streams._regroup`)."""
        from stoker.streams._regroup import regrouped_state
        from stoker.streams.shuffle import check_positions_state

        owner, files = type(self).__name__, len(self._record_order())
        checked = {
            worker_id: (
                None if state is None
                else check_positions_state(owner, state, files, self.shuffle_buffer),
                ended,
            )
            for worker_id, (state, ended) in streams.items()
        }  # fmt: skip
        return regrouped_state(self, checked, num_workers)

    # -- cheap captures (stoker._state_capture) ------------------------------------------
    def _saves_state(self) -> bool:
        return True

    def _capture_state(self) -> Any:
        """The live iteration's positions (a few bytes per buffered record); None between
        iterations, where the next epoch starts afresh."""
        live = self._live
        return None if live is None or live.ended else live.positions_state()

    def _captured_state(self, capture: Any) -> dict[str, Any] | None:
        return capture
