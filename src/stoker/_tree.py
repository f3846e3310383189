"""Walking and rebuilding a nested batch: torch's container rules, in one place.

A sample or a batch is a tree. Its containers are mappings and sequences: a ``dict``,
``OrderedDict``, ``defaultdict`` or any other ``Mapping``; a namedtuple, ``tuple``,
``list`` or any other ``Sequence``. Everything else is a leaf: arrays, tensors, numbers,
``None``, custom objects, and the sequences that hold characters or numbers rather than
elements (``str``, ``bytes``, ``bytearray``, ``memoryview``, ``range``).

Rebuilding follows torch's ``pin_memory`` and ``default_convert``: a mutable mapping or
sequence is shallow-copied and updated in place, so a subclass keeps its type and extra
attributes (a ``defaultdict`` keeps its ``default_factory``, an ``OrderedDict`` its
order); other mappings and sequences are rebuilt by their type; a namedtuple keeps its
type; a container that cannot be rebuilt becomes a ``dict`` / ``list``. The two torch
functions differ only in what a plain tuple becomes (``tuple_as_list``).

* :func:`leaves` yields the leaves; :func:`walk` yields them with their path of keys
  and indices.
* :func:`map_leaves` rebuilds the whole tree with each leaf converted.
* :func:`rebuild` rebuilds one level with each element converted (the caller recurses);
  :func:`rebuild_with` puts given elements into a container like the template (what
  collate does with the columns it transposed).
"""

from __future__ import annotations

import collections.abc
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "children",
    "is_container",
    "is_namedtuple",
    "leaves",
    "map_leaves",
    "rebuild",
    "rebuild_with",
    "walk",
]

Path = tuple[Any, ...]

# Sequences of characters, bytes or numbers: one value each, never walked into.
_LEAF_SEQUENCES = (str, bytes, bytearray, memoryview, range)
_PLAIN_CONTAINERS = frozenset((list, tuple, dict))
_PLAIN_LEAVES = frozenset((np.ndarray, int, float, bool, str, bytes, type(None)))


def is_namedtuple(data: Any) -> bool:
    """True for an instance of a ``collections.namedtuple`` or ``typing.NamedTuple`` class."""
    return isinstance(data, tuple) and hasattr(data, "_fields")


def is_container(data: Any) -> bool:
    """True for a mapping, or a sequence that is not a string, bytes or a range.

    Example:
        >>> is_container({"a": 1}), is_container((1, 2)), is_container("ab"), is_container(3)
        (True, True, False, False)
    """
    kind = type(data)
    if kind in _PLAIN_CONTAINERS:  # the usual batch: exact types first, ABC checks are slow
        return True
    if kind in _PLAIN_LEAVES:
        return False
    if isinstance(data, Mapping):
        return True
    return isinstance(data, Sequence) and not isinstance(data, _LEAF_SEQUENCES)


def children(data: Any) -> Iterator[tuple[Any, Any]]:
    """``(key, element)`` of a container: a mapping's items, a sequence's ``(index, element)``."""
    return iter(data.items()) if isinstance(data, Mapping) else enumerate(data)


def leaves(data: Any) -> Iterator[Any]:
    """Every leaf of ``data``, depth first, in the containers' order.

    Example:
        >>> list(leaves({"x": [1, (2, "ab")], "y": 3}))
        [1, 2, 'ab', 3]
    """
    if not is_container(data):
        yield data
        return
    for element in data.values() if isinstance(data, Mapping) else data:
        yield from leaves(element)


def walk(
    data: Any, *, is_leaf: Callable[[Any], bool] | None = None, path: Path = ()
) -> Iterator[tuple[Path, Any]]:
    """Every leaf of ``data`` with its path of mapping keys and sequence indices.

    Args:
        data: the tree.
        is_leaf: containers for which it returns True are yielded whole.
        path: the path of ``data`` itself, prepended to every path.

    Example:
        >>> list(walk({"x": [1, 2], "y": 3}))
        [(('x', 0), 1), (('x', 1), 2), (('y',), 3)]
    """
    if not is_container(data) or (is_leaf is not None and is_leaf(data)):
        yield path, data
        return
    for key, element in children(data):
        yield from walk(element, is_leaf=is_leaf, path=(*path, key))


def map_leaves(data: Any, convert: Callable[[Any], Any], *, tuple_as_list: bool = False) -> Any:
    """``data`` rebuilt with ``convert`` applied to every leaf.

    Example:
        >>> from collections import namedtuple
        >>> Pair = namedtuple("Pair", "a b")
        >>> map_leaves({"p": Pair(1, [2, 3])}, lambda v: v * 10)
        {'p': Pair(a=10, b=[20, 30])}
    """
    if not is_container(data):
        return convert(data)

    def convert_element(element: Any) -> Any:
        return map_leaves(element, convert, tuple_as_list=tuple_as_list)

    return rebuild(data, convert_element, tuple_as_list=tuple_as_list)


def rebuild(data: Any, convert: Callable[[Any], Any], *, tuple_as_list: bool = False) -> Any:
    """``data`` (a mapping or sequence) with ``convert`` applied to each element.

    Example:
        >>> from collections import defaultdict
        >>> d = defaultdict(list, a=1)
        >>> r = rebuild(d, lambda v: v * 10)
        >>> type(r).__name__, r["a"], r.default_factory is list
        ('defaultdict', 10, True)
    """
    if isinstance(data, Mapping):
        return rebuild_with(data, {k: convert(v) for k, v in data.items()})
    return rebuild_with(data, [convert(v) for v in data], tuple_as_list=tuple_as_list)


def rebuild_with(data: Any, values: Any, *, tuple_as_list: bool = False) -> Any:
    """A container like ``data`` holding ``values``.

    Args:
        data: the template, a mapping or a sequence.
        values: for a mapping, a ``dict`` with its keys; for a sequence, a ``list`` of its
            length. It may be returned itself (a plain tuple with ``tuple_as_list``, or a
            container that cannot be rebuilt).
        tuple_as_list: a plain tuple (not a namedtuple) becomes a list, as in torch's
            ``default_collate`` and ``default_convert``; else it keeps its type, as in
            torch's ``pin_memory``.

    Example:
        >>> from collections import OrderedDict
        >>> rebuild_with(OrderedDict(a=1, b=2), {"a": 10, "b": 20})
        OrderedDict([('a', 10), ('b', 20)])
        >>> rebuild_with((1, 2), [10, 20], tuple_as_list=True)
        [10, 20]
    """
    if isinstance(data, Mapping):
        return _mapping_like(data, values)
    if isinstance(data, tuple):
        if is_namedtuple(data):
            return type(data)(*values)
        return values if tuple_as_list else type(data)(values)
    return _sequence_like(data, values)


def _mapping_like(data: Mapping[Any, Any], values: dict[Any, Any]) -> Any:
    try:
        if isinstance(data, collections.abc.MutableMapping):
            clone = copy.copy(data)  # keeps a subclass's state: defaultdict's default_factory
            clone.update(values)
            return clone
        return type(data)(values)  # type: ignore[call-arg]
    except TypeError:  # no copy() / update(), or no __init__(mapping)
        return values


def _sequence_like(data: Sequence[Any], values: list[Any]) -> Any:
    try:
        if isinstance(data, collections.abc.MutableSequence):
            clone = copy.copy(data)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(data)(values)  # type: ignore[call-arg]
    except TypeError:  # no copy() / __setitem__, or no __init__(iterable): range
        return values
