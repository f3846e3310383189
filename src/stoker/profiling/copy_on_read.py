"""Python containers on a dataset that process workers copy as they read them.

A forked worker shares the trainer's memory until it writes to a page. Reading a Python
object writes to it (its reference count), so a worker that reads a list of a million
paths copies, page by page, every object it touches: over an epoch each worker grows by
about the size of the list. Under ``spawn`` / ``forkserver`` each worker unpickles its own
full copy at start. ``gc.freeze()`` before forking does not help: the writes come from
reference counts, not from the collector (a measurement recorded in docs/memory.md and
BENCHMARKS.md: less than 1% change in worker growth on 1M paths and on 1M small dicts).

Numpy arrays and :mod:`stoker.compact` containers hold their items in a few buffers that
nobody writes to, so they stay shared. Before a loader starts process workers it looks
over the dataset's attributes (a bounded walk: two levels of objects, a few milliseconds)
for large lists, tuples and dicts of small Python objects, warns once about each, and
with ``compact_dataset=True`` replaces those :func:`stoker.compact.compact` can hold.

Example:
    >>> class Paths:
    ...     def __init__(self):
    ...         self.paths = [f"/data/{i:08d}.jpg" for i in range(300_000)]
    >>> [found.where for found in find_large_containers(Paths())]
    ['dataset.paths']
"""

from __future__ import annotations

import collections
import multiprocessing
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "LargeContainer",
    "compact_large_containers",
    "find_large_containers",
    "start_method",
    "warning_text",
]

MIN_ITEMS = 10_000  # fewer items cannot reach MIN_BYTES with small objects
MIN_BYTES = 16 * 2**20  # what a worker may copy before it is worth a warning
_SAMPLED = 64  # items whose size is measured, spread over the container
_MAX_DEPTH = 2  # dataset.attr.attr: wrapped datasets (Subset, ConcatDataset members)
_MAX_MEMBERS = 16  # a short list of objects is walked into (ConcatDataset.datasets)
_BUDGET_S = 0.05
_ARRAY_HEADER = sys.getsizeof(np.empty(0))  # what reading an array writes to: its header
_SKIPPED_TYPES = (np.ndarray, str, bytes, type, int, float, bool)


@dataclass(frozen=True, slots=True)
class LargeContainer:
    """A large list, tuple or dict of Python objects found on a dataset."""

    where: str  # "dataset.paths", "dataset.dataset.records"
    owner: Any  # the object holding the attribute
    attribute: str
    kind: str  # "list of str"
    items: int
    nbytes: int  # estimated bytes of its Python objects, the container included

    @property
    def compactable(self) -> bool:
        """Whether :func:`stoker.compact.compact` can hold it (strings, bytes or records)."""
        return self.kind.split(" of ")[0] in ("list", "tuple") and self.kind.split(" of ")[-1] in (
            "str",
            "bytes",
            "tuple",
            "dict",
        )


def find_large_containers(dataset: Any, *, budget_s: float = _BUDGET_S) -> list[LargeContainer]:
    """The dataset's attributes that would cost each process worker ``MIN_BYTES`` or more."""
    deadline = time.perf_counter() + budget_s
    found = []
    for where, owner, attribute, value in _attributes(dataset, "dataset", 0, set()):
        if time.perf_counter() > deadline:
            break
        container = _measure(where, owner, attribute, value)
        if container is not None and container.nbytes >= MIN_BYTES:
            found.append(container)
    return found


def _attributes(
    obj: Any, where: str, depth: int, seen: set[int]
) -> Iterator[tuple[str, Any, str, Any]]:
    """(where, owner, attribute name, value) for the attributes of ``obj`` and its members."""
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    try:
        attributes = dict(vars(obj))
    except TypeError:  # no __dict__ (slots, builtins)
        return
    for name, value in attributes.items():
        if isinstance(value, _SKIPPED_TYPES) or (
            callable(value) and not hasattr(value, "__getitem__")
        ):
            continue
        yield f"{where}.{name}", obj, name, value
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_MEMBERS:
            for k, member in enumerate(value):
                yield from _attributes(member, f"{where}.{name}[{k}]", depth + 1, seen)
        elif not isinstance(value, (list, tuple, dict)) and hasattr(value, "__dict__"):
            yield from _attributes(value, f"{where}.{name}", depth + 1, seen)


def _measure(where: str, owner: Any, attribute: str, value: Any) -> LargeContainer | None:
    if not isinstance(value, (list, tuple, dict)) or len(value) < MIN_ITEMS:
        return None
    n = len(value)
    picks = np.linspace(0, n - 1, min(_SAMPLED, n)).astype(np.int64).tolist()
    if isinstance(value, dict):
        keys = list(_nth_keys(value, set(picks)))
        sampled = [(k, value[k]) for k in keys]
        sizes = [_size(k) + _size(v) for k, v in sampled]
        types = collections.Counter(type(v).__name__ for _, v in sampled)
    else:
        sampled = [value[i] for i in picks]
        sizes = [_size(item) for item in sampled]
        types = collections.Counter(type(item).__name__ for item in sampled)
    nbytes = sys.getsizeof(value) + int(n * (sum(sizes) / len(sizes)))
    kind = f"{type(value).__name__} of {types.most_common(1)[0][0]}"
    return LargeContainer(where, owner, attribute, kind, n, nbytes)


def _nth_keys(mapping: Mapping[Any, Any], wanted: set[int]) -> Iterator[Any]:
    for i, key in enumerate(mapping):
        if i in wanted:
            yield key
        if i >= max(wanted):
            return


def _size(item: Any) -> int:
    """Bytes of ``item`` a reader may copy: the object, and one level of what it holds."""
    if isinstance(item, np.ndarray):
        return _ARRAY_HEADER
    size = sys.getsizeof(item)
    if isinstance(item, (tuple, list)):
        size += sum(_ARRAY_HEADER if isinstance(x, np.ndarray) else sys.getsizeof(x) for x in item)
    elif isinstance(item, dict):
        size += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in item.items())
    return size


def start_method(context: Any) -> str:
    """``"fork"``, ``"spawn"`` or ``"forkserver"``: how workers of ``context`` start."""
    if context is None:
        return multiprocessing.get_context().get_start_method()
    return context if isinstance(context, str) else context.get_start_method()


def warning_text(found: LargeContainer, start_method: str) -> str:
    """The warning for one container: what it costs each worker, and the one-line fix."""
    mib = found.nbytes / 2**20
    if start_method == "fork":
        cost = (
            f"Forked workers copy the memory of every Python object they read (reading writes its "
            f"reference count), so each worker can grow by up to about {mib:,.0f} MiB over an epoch"
        )
    else:
        cost = f"Each {start_method} worker unpickles its own copy: about {mib:,.0f} MiB per worker"
    if found.compactable:
        fix = (
            f"Keep it compact: `self.{found.attribute} = stoker.compact(self.{found.attribute})` "
            "in the dataset's __init__ (one buffer the workers share), or pass "
            "compact_dataset=True to let the loader do it"
        )
    else:
        fix = (
            "Keep it in numpy arrays or stoker.compact containers (StringArray, RecordArray), "
            "which workers share without copying"
        )
    return (
        f"DataLoader: {found.where} is a {found.kind} with {found.items:,} items (about "
        f"{mib:,.0f} MiB of Python objects). {cost}. {fix}. See docs/memory.md."
    )


def compact_large_containers(found: list[LargeContainer]) -> list[str]:
    """Replaces each compactable container with :func:`stoker.compact.compact` of it.

    Returns where it did; a container compact() cannot hold (mixed items, records of
    different shapes) or an attribute that cannot be set is left as it was.
    """
    from stoker.compact import compact

    done = []
    for container in found:
        if not container.compactable:
            continue
        try:
            value = getattr(container.owner, container.attribute)
            setattr(container.owner, container.attribute, compact(value))
        except (TypeError, ValueError, AttributeError):
            continue
        done.append(container.where)
    return done
