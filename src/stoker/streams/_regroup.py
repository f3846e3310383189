"""A file reader's mid-epoch state resumed with another number of workers (or ranks).

Each (rank, worker) shard of a reader reads a fixed part of the epoch's files
(:func:`stoker.sharding.shard_for_worker`: whole files, or every ``k``-th record of a
shared file), and its state says how far it got: the last record read, minus the records
still in its shuffle buffer. Those two facts name exactly which records the shard has
delivered, whatever shard reads next. So a state saved by ``W`` workers resumes with
``W'``: every new worker gets the same *regrouped* state, a list of *marks*, one per old
shard that delivered something::

    {"shard": [index, count], "read": [file, record] or None,
     "buffer": [[file, record], ...], "ended": bool}

and reads its own new shard, skipping each record an old shard delivered (a record
belongs to one shard of each topology, so the check is one lookup per mark). The new
workers' states carry the marks on, so a second resume, with the same or yet another
worker count, still skips them; they are dropped at the epoch's end. Every record of the
epoch is delivered exactly once; the order after the change is the new workers' order,
not the one an uninterrupted run with ``W'`` workers would have had.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._validate import is_int
from stoker.sharding import current_shard, shard_for_worker
from stoker.streams._records import STATE_KIND, state_error, state_position, state_shard

__all__ = ["Delivered", "check_marks", "regrouped_state"]

Position = tuple[int, int]


def regrouped_state(
    reader: Any, streams: Mapping[int, tuple[Mapping[str, Any] | None, bool]], num_workers: int
) -> dict[str, Any]:
    """The state each new worker's copy of ``reader`` opens from (see the module docs).

    ``streams``: each old worker's (or, with ``num_workers=0``, the main process's)
    reader state, checked (``check_positions_state``), and whether its stream had ended;
    ``num_workers``: the old count.
    """
    marks: list[dict[str, Any]] = []
    epoch = reader.epoch
    for worker_id, (state, ended) in sorted(streams.items()):
        if state is not None:
            epoch = state["epoch"]
            marks.extend(m for m in state.get("delivered", ()) if m not in marks)
            shard, read, buffer = state["shard"], state["read"], state["buffer"].tolist()
            if shard is None:  # a regrouped state no record of which was read yet
                continue
        else:
            shard = list(
                current_shard(
                    rank=reader.rank, world_size=reader.world_size, worker_id=worker_id,
                    num_workers=max(num_workers, 1),
                )
            )  # fmt: skip
            read, buffer = None, []
        if ended or read is not None:
            marks.append({"shard": list(shard), "read": read, "buffer": buffer, "ended": ended})
    return {
        "kind": STATE_KIND, "epoch": epoch, "shard": None, "read": None,
        "buffer": np.zeros((0, 2), dtype=np.int64), "rng": None, "delivered": marks,
    }  # fmt: skip


def check_marks(owner: str, value: Any, files: int) -> list[dict[str, Any]]:
    """``state['delivered']``, checked: a list of marks (see the module docs)."""
    if not isinstance(value, (list, tuple)):
        raise state_error(owner, "state['delivered']", value, "a list of marks")
    marks = []
    for k, mark in enumerate(value):
        entry = f"state['delivered'][{k}]"
        if not isinstance(mark, Mapping) or set(mark) != {"shard", "read", "buffer", "ended"}:
            must = "a mark: a dict of 'shard', 'read', 'buffer' and 'ended'"
            raise state_error(owner, entry, mark, must)
        if not isinstance(mark["ended"], bool):
            raise state_error(owner, f"{entry}['ended']", mark["ended"], "a bool")
        shard = state_shard(owner, mark["shard"])
        read = mark["read"]
        if read is not None:
            read = list(state_position(owner, f"{entry}['read']", read, files))
        rows = mark["buffer"]
        rows = rows.tolist() if isinstance(rows, np.ndarray) else rows
        if not isinstance(rows, (list, tuple)):
            raise state_error(owner, f"{entry}['buffer']", rows, "a list of [file, record]")
        buffer = [
            list(state_position(owner, f"{entry}['buffer'][{i}]", p, files))
            for i, p in enumerate(rows)
        ]
        marks.append({"shard": shard, "read": read, "buffer": buffer, "ended": mark["ended"]})
    return marks


class Delivered:
    """Which records of the epoch the marks say were delivered (``position in delivered``)."""

    __slots__ = ("_marks",)

    def __init__(self, owner: str, marks: Iterable[Mapping[str, Any]], order: Sequence[int]):
        self._marks: list[tuple[dict[int, int], int, int, Position | None, set[Position], bool]]
        self._marks = []
        for k, mark in enumerate(marks):
            index, count = mark["shard"]
            shard = shard_for_worker(
                order, rank=0, world_size=1, worker_id=index, num_workers=count
            )
            place = {f: i for i, f in enumerate(shard.items)}
            read = None
            if mark["read"] is not None:
                f, r = mark["read"]
                offset, stride = shard.record_offset, shard.record_stride
                if not is_int(r) or f not in place or r < offset or (r - offset) % stride:
                    msg = (
                        f"{owner}: state['delivered'][{k}]['read'] is record {r} of file {f}, "
                        f"which shard {index} of {count} does not read in this epoch: the files "
                        "or the epoch differ from the ones the state was saved with"
                    )
                    raise ValueError(msg)
                read = (place[f], r)
            buffer = {(int(f), int(r)) for f, r in mark["buffer"]}
            self._marks.append(
                (place, shard.record_offset, shard.record_stride, read, buffer, mark["ended"])
            )

    def __contains__(self, position: Position) -> bool:
        f, r = position
        for place, offset, stride, read, buffer, ended in self._marks:
            k = place.get(f)
            if k is None or r < offset or (r - offset) % stride:
                continue  # another shard of that topology read it
            if ended or (read is not None and (k, r) <= read and position not in buffer):
                return True
        return False
