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
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from stoker._validate import check_optional_int
from stoker.engine.random_scopes import current_scope
from stoker.sharding import current_shard, shard_for_worker

__all__ = ["Position", "RecordStream", "check_stream_state"]

Position = tuple[int, int]
STATE_KIND = "stoker.stream"


def _closing(records: Iterable[Any]) -> None:
    close = getattr(records, "close", None)
    if close is not None:
        close()


def check_stream_state(owner: str, state: Any, kind: str) -> dict[str, Any]:
    """``state`` if it is a state of ``kind`` saved by this shard; raises a clear error if not."""
    if not isinstance(state, Mapping) or state.get("kind") != kind:
        msg = f"{owner}.load_state_dict expects a state saved by {owner}.state_dict, got {state!r}"
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
            f"(rank x worker), and is loaded in shard {shard[0]} of {shard[1]}; resume with the "
            "same numbers of ranks and workers, each loading its own state"
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
    ) -> Iterator[Any]:
        """``(position, sample)`` of this shard's records, starting after ``after``.

        With ``live``, each record's position is also set as ``live.read`` before it is
        yielded; with ``keyed=False`` the samples come alone (one generator, no pairs);
        ``ends``: this is the whole stream, and ``live.ended`` is set once it has run out.
        """
        order = self._record_order()
        shard = shard_for_worker(order, rank=self.rank, world_size=self.world_size)
        items, stride = shard.items, shard.record_stride
        start_k, first = 0, shard.record_offset
        if after is not None:
            if after[0] not in items:
                msg = (
                    f"{type(self).__name__}: the saved position is in file {after[0]}, which this "
                    "shard does not read this epoch; resume with the same files, epoch and topology"
                )
                raise ValueError(msg)
            start_k, first = items.index(after[0]), after[1] + stride
        skip = self._skip_marker
        live = _Cursor() if live is None else live
        with self._opened_files(order, start_k) as local:
            for k in range(start_k, len(items)):
                file_index = items[k]
                records = self._open_records(file_index, local)
                try:
                    start = first if k == start_k else shard.record_offset
                    for r, raw in itertools.islice(enumerate(records), start, None, stride):
                        value = self._finish_at(raw, file_index, r)
                        if value is not skip:
                            live.read = position = (file_index, r)
                            yield (position, value) if keyed else value
                finally:
                    _closing(records)
        if ends:
            live.ended = True

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
                f"{missing[:4]} that the saved state holds; the files changed since it was saved"
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
        """Makes the next iteration continue where ``state`` (from :meth:`state_dict`) stood."""
        state = check_stream_state(type(self).__name__, state, STATE_KIND)
        self.epoch = int(state["epoch"])
        self._resume = state

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
