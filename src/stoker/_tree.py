"""Rebuilding a nested batch with each element converted: torch's container rules, once.

A mutable mapping or sequence is shallow-copied and updated in place, so a subclass keeps
its type and extra attributes (a ``defaultdict`` keeps its ``default_factory``, an
``OrderedDict`` its order); other mappings and sequences are rebuilt by their type; a
namedtuple keeps its type; a container that cannot be rebuilt becomes a ``dict`` /
``list``. These are the rules of torch's ``pin_memory`` and ``default_convert``, which
differ only in what a plain tuple becomes (``tuple_as_list``).
"""

from __future__ import annotations

import collections.abc
import copy
from collections.abc import Callable
from typing import Any

__all__ = ["rebuild"]


def rebuild(data: Any, convert: Callable[[Any], Any], *, tuple_as_list: bool = False) -> Any:
    """``data`` (a mapping or sequence) with ``convert`` applied to each element.

    Example:
        >>> from collections import defaultdict
        >>> d = defaultdict(list, a=1)
        >>> r = rebuild(d, lambda v: v * 10)
        >>> type(r).__name__, r["a"], r.default_factory is list
        ('defaultdict', 10, True)
    """
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({k: convert(v) for k, v in data.items()})
                return clone
            return type(data)({k: convert(v) for k, v in data.items()})  # type: ignore[call-arg]
        except TypeError:
            return {k: convert(v) for k, v in data.items()}
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(convert(v) for v in data))
        if tuple_as_list:
            return [convert(v) for v in data]
        return type(data)(convert(v) for v in data)
    try:
        if isinstance(data, collections.abc.MutableSequence):
            items = copy.copy(data)
            for i, v in enumerate(data):
                items[i] = convert(v)
            return items
        return type(data)([convert(v) for v in data])  # type: ignore[call-arg]
    except TypeError:
        return [convert(v) for v in data]
