"""Merging a list of samples into one batch.

The registry works like ``torch.utils.data``'s: :data:`default_collate_fn_map` maps an
element type (or a tuple of types) to a function ``fn(batch, *, collate_fn_map)``, and
:func:`collate` dispatches on the type of the batch's first element (exact type first,
then ``isinstance`` over the map in order), recursing into mappings, namedtuples and
sequences. :func:`default_collate` is :func:`collate` with the default map; its output
is numpy (torch tensors stay torch tensors). :mod:`stoker.torch` converts to tensors.

On top of it sit two collates for variable-size data: :class:`PadCollate` /
:func:`pad_collate` pad sequences to the batch maximum and add a mask and lengths, and
:class:`RaggedCollate` concatenates variable-count fields (detection boxes) and adds a
batch index.

Every numpy array these functions create for a batched field can be written straight
into memory someone else owns (a shared-memory slot) with :func:`collate_into`.

Errors name the field inside the sample (``sample['image']``, ``sample[1]``,
``sample['meta']['boxes']``) and the samples that disagree; they raise
:class:`~stoker.CollateError`, a ``TypeError``.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import copy
import numbers
import re
import sys
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from stoker._errors import CollateError
from stoker._stacked import StackedSamples

__all__ = [
    "PadCollate",
    "RaggedCollate",
    "collate",
    "collate_into",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "pad_collate",
    "register_collate",
]

CollateFnMap = dict[Any, Callable[..., Any]]
Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]

_STR_OBJ_DTYPE = re.compile(r"[SaUO]")  # torch's np_str_obj_array_pattern
_RESIZE_HINT = "Resize in the transform, or use pad_collate to pad variable-length fields."

# The field being collated, as a tuple of ("key", k) / ("index", i) / ("attr", name).
_PATH: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar(
    "stoker_collate_path", default=()
)
_ALLOCATOR: contextvars.ContextVar[Allocator | None] = contextvars.ContextVar(
    "stoker_collate_allocator", default=None
)
_SHAPE_HINT: contextvars.ContextVar[str] = contextvars.ContextVar(
    "stoker_collate_shape_hint", default=_RESIZE_HINT
)
_NOTE_PREFIX = "stoker: raised while collating "


# --------------------------------------------------------------------------- helpers


def _torch() -> Any:
    """The torch module if it is already imported, else None (never imports it)."""
    return sys.modules.get("torch")


def _is_tensor(obj: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


class _TorchTensorMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return _is_tensor(obj)

    def __repr__(cls) -> str:
        return "<torch.Tensor, matched without importing torch>"


class _TorchTensor(metaclass=_TorchTensorMeta):
    """A registry key matching ``torch.Tensor`` instances without importing torch."""


def _format_path(path: tuple[tuple[str, Any], ...]) -> str:
    parts = ["sample"]
    for kind, key in path:
        parts.append(f".{key}" if kind == "attr" else f"[{key!r}]")
    return "".join(parts)


def _field() -> str:
    path = _PATH.get()
    return f"field {_format_path(path)}" if path else "the samples"


def _type_name(obj: object) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


@contextlib.contextmanager
def _at(kind: str, key: Any) -> Iterator[None]:
    token = _PATH.set((*_PATH.get(), (kind, key)))
    try:
        yield
    finally:
        _PATH.reset(token)


def _collate_at(kind: str, key: Any, batch: Sequence[Any], collate_fn_map: Any) -> Any:
    with _at(kind, key):
        return collate(batch, collate_fn_map=collate_fn_map)


def _mixed_types_error(batch: Sequence[Any], i: int, expected: str) -> CollateError:
    msg = (
        f"cannot collate {_field()} (batch of {len(batch)}): sample 0 is "
        f"{_type_name(batch[0])} but sample {i} is {_type_name(batch[i])}, where {expected} "
        f"was expected. Make every sample return the same type for this field."
    )
    return CollateError(msg)


def _unsupported_error(batch: Sequence[Any]) -> CollateError:
    elem = batch[0]
    if elem is None:
        msg = (
            f"cannot collate {_field()} (batch of {len(batch)}): it is None in sample 0, and "
            f"None cannot be batched. Return a placeholder value instead, filter such samples "
            f"out, or pass a collate_fn= that handles None."
        )
        return CollateError(msg)
    msg = (
        f"cannot collate {_field()} (batch of {len(batch)}): default_collate does not know "
        f"how to batch objects of type {_type_name(elem)}. Pass collate_fn= to the "
        f"DataLoader, or teach default_collate this type with "
        f"stoker.collate.register_collate({type(elem).__qualname__}, fn)."
    )
    return CollateError(msg)


def _check_same_shape(batch: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> None:
    first = shapes[0]
    for i, shape in enumerate(shapes):
        if shape != first:
            msg = (
                f"cannot stack {_field()} (batch of {len(batch)}): sample 0 has shape "
                f"{first} but sample {i} has shape {shape}. {_SHAPE_HINT.get()}"
            )
            raise CollateError(msg)


def _alloc(shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
    """An output array from the active allocator, or None when there is none."""
    allocator = _ALLOCATOR.get()
    if allocator is None:
        return None
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    out = allocator(shape, dtype)
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype:
        got = (
            f"shape {out.shape} and dtype {out.dtype}"
            if isinstance(out, np.ndarray)
            else f"a {_type_name(out)}"
        )
        msg = (
            f"the collate_into allocator must return a numpy array of shape {shape} and "
            f"dtype {dtype}, got {got}"
        )
        raise ValueError(msg)
    if not out.flags.writeable:
        msg = f"the collate_into allocator returned a read-only array for shape {shape}"
        raise ValueError(msg)
    return out


def _empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    out = _alloc(shape, dtype)
    return np.empty(shape, dtype) if out is None else out


def _finish(arr: np.ndarray) -> np.ndarray:
    """``arr``, moved into allocator memory when an allocator is active."""
    out = _alloc(arr.shape, arr.dtype)
    if out is None:
        return arr
    np.copyto(out, arr)
    return out


def _torch_alloc(shape: tuple[int, ...], dtype: Any) -> Any:
    """A tensor backed by allocator memory, or None (no allocator, or no numpy dtype)."""
    if _ALLOCATOR.get() is None:
        return None
    torch = _torch()
    try:
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16 and friends have no numpy dtype
        return None
    out = _alloc(shape, np_dtype)
    return torch.from_numpy(out)


def _same_type(batch: Sequence[Any], kind: type) -> bool:
    """True when every element's type is exactly ``kind`` (one C-level pass)."""
    types = set(map(type, batch))
    return len(types) == 1 and kind in types


def _is_number(x: object) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.number))


# ------------------------------------------------------------------ leaf collate fns


def _collate_tensor(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    torch = _torch()
    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        kind = "nested" if elem.is_nested else "sparse"
        msg = (
            f"cannot stack {_field()} (batch of {len(batch)}): batches of {kind} tensors are "
            f"not supported by default_collate. Pass a collate_fn that handles them."
        )
        raise CollateError(msg)
    for i, t in enumerate(batch):
        if not isinstance(t, torch.Tensor):
            raise _mixed_types_error(batch, i, "a torch.Tensor")
    _check_same_shape(batch, [tuple(t.shape) for t in batch])
    out = None
    if elem.device.type == "cpu" and not any(t.requires_grad for t in batch):
        dtype = batch[0].dtype
        for t in batch[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        out = _torch_alloc((len(batch), *elem.shape), dtype)
    return torch.stack(list(batch), 0, out=out)


def _collate_ndarray(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    elem = batch[0]
    if _same_type(batch, np.ndarray) and not _STR_OBJ_DTYPE.search(elem.dtype.str):
        dtypes = {a.dtype for a in batch}
        shapes = {a.shape for a in batch}
        if len(dtypes) == 1 and len(shapes) == 1:  # the common case: validated in bulk
            out = np.stack(batch, out=_alloc((len(batch), *elem.shape), elem.dtype))
            return out if type(out) is np.ndarray else out.view(np.ndarray)
    for i, a in enumerate(batch):
        if not isinstance(a, (np.ndarray, np.generic)) and not _is_number(a):
            raise _mixed_types_error(batch, i, "a numpy array")
        if _STR_OBJ_DTYPE.search(np.asarray(a).dtype.str):
            msg = (
                f"cannot stack {_field()} (batch of {len(batch)}): sample {i} is a numpy "
                f"array of dtype {np.asarray(a).dtype} (strings or objects), which "
                f"default_collate cannot batch into one array (torch refuses them too). "
                f"Convert it to numbers in the transform, return Python str values (they are "
                f"collated into a list), or pass collate_fn=."
            )
            raise CollateError(msg)
    _check_same_shape(batch, [np.shape(a) for a in batch])
    dtype = elem.dtype
    if any(np.asarray(a).dtype != dtype for a in batch):
        dtype = np.result_type(*[np.asarray(a).dtype for a in batch])
    out = np.stack(batch, out=_alloc((len(batch), *elem.shape), dtype))
    return out if type(out) is np.ndarray else out.view(np.ndarray)


def _collate_numpy_scalar(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    for i, x in enumerate(batch):
        if not _is_number(x):
            raise _mixed_types_error(batch, i, "a numpy number")
    return _finish(np.array(batch))


def _collate_int(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    # bool is an int: a batch of bools becomes a bool array, as in torch.
    if _same_type(batch, int):
        try:
            return _finish(np.array(batch, dtype=np.int64))
        except OverflowError:
            pass  # the general path below explains it
    for i, x in enumerate(batch):
        if not _is_number(x):
            raise _mixed_types_error(batch, i, "a number")
    if all(isinstance(x, (bool, np.bool_)) for x in batch):
        dtype: Any = np.bool_
    elif any(isinstance(x, (float, np.floating)) for x in batch):
        dtype = np.float64
    else:
        dtype = np.int64
    try:
        arr = np.array(batch, dtype=dtype)
    except OverflowError as exc:
        msg = (
            f"cannot collate {_field()} (batch of {len(batch)}): a value does not fit in "
            f"int64 ({exc}). Return a float, or a numpy array of a suitable dtype."
        )
        raise CollateError(msg) from exc
    return _finish(arr)


def _collate_float(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    if _same_type(batch, float):
        return _finish(np.array(batch, dtype=np.float64))
    for i, x in enumerate(batch):
        if not _is_number(x):
            raise _mixed_types_error(batch, i, "a number")
    return _finish(np.array(batch, dtype=np.float64))


def _collate_str(batch: Sequence[Any], *, collate_fn_map: Any = None) -> list[Any]:
    for i, x in enumerate(batch):
        if not isinstance(x, (str, bytes)):
            raise _mixed_types_error(batch, i, "a str or bytes")
    return list(batch)


default_collate_fn_map: CollateFnMap = {
    _TorchTensor: _collate_tensor,
    np.ndarray: _collate_ndarray,  # and np.memmap, a subclass
    (np.bool_, np.number): _collate_numpy_scalar,
    float: _collate_float,
    int: _collate_int,
    str: _collate_str,
    bytes: _collate_str,
}
"""The element type -> collate function registry used by :func:`default_collate`.

Each function is called as ``fn(batch, *, collate_fn_map)``. Extend it with
:func:`register_collate` (which gives the new entry precedence over built-in ones), or
pass your own map to :func:`collate`. The ``torch.Tensor`` entry is a stand-in class
that matches tensors without importing torch.
"""

_DEFAULT_FNS = frozenset(default_collate_fn_map.values())


def register_collate(type_: type | tuple[type, ...], fn: Callable[..., Any]) -> Callable[..., Any]:
    """Teaches :func:`default_collate` to batch elements of ``type_`` with ``fn``.

    ``fn`` is called as ``fn(batch, *, collate_fn_map)`` with the list of the field's
    values across the batch; it may call :func:`collate` on parts of them. The entry is
    placed first in :data:`default_collate_fn_map`, so it wins over built-in entries
    for subclasses too (registering ``np.integer`` overrides the numpy-scalar rule).
    Registering a type again replaces its function.

    Register at import time of a module the dataset's module imports: worker
    processes started with ``spawn`` re-import modules and do not see registrations
    made later in ``__main__``, and registering while another thread collates is not
    safe (the map is reordered in place).

    Args:
        type_: a class, or a tuple of classes.
        fn: the collate function.

    Returns:
        ``fn``, so that this also works as ``register_collate(T, fn)`` in an assignment.

    Example:
        >>> from fractions import Fraction
        >>> _ = register_collate(Fraction, lambda batch, *, collate_fn_map: sum(batch))
        >>> default_collate([Fraction(1, 2), Fraction(1, 3)])
        Fraction(5, 6)
        >>> del default_collate_fn_map[Fraction]
    """
    types = type_ if isinstance(type_, tuple) else (type_,)
    if not types or not all(isinstance(t, type) for t in types):
        msg = f"register_collate needs a class or a tuple of classes, got {type_!r}"
        raise TypeError(msg)
    if not callable(fn):
        msg = f"register_collate needs a callable fn(batch, *, collate_fn_map), got {fn!r}"
        raise TypeError(msg)
    rest = [(k, v) for k, v in default_collate_fn_map.items() if k != type_]
    default_collate_fn_map.clear()
    default_collate_fn_map[type_] = fn
    default_collate_fn_map.update(rest)
    return fn


# ---------------------------------------------------------------------- the dispatcher


def _lookup(elem: object, collate_fn_map: CollateFnMap | None) -> Callable[..., Any] | None:
    if collate_fn_map is None:
        return None
    fn = collate_fn_map.get(type(elem))
    if fn is not None:
        return fn
    for key, candidate in collate_fn_map.items():
        if isinstance(elem, key):
            return candidate
    return None


def _add_note(exc: BaseException, batch: Sequence[Any]) -> None:
    if not hasattr(exc, "add_note"):  # Python 3.10
        return
    if any(str(n).startswith(_NOTE_PREFIX) for n in getattr(exc, "__notes__", ())):
        return
    exc.add_note(f"{_NOTE_PREFIX}{_field()} (batch of {len(batch)})")


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Collates ``batch`` by the type of its first element, recursing into containers.

    The function for a leaf comes from ``collate_fn_map``: the entry for the element's
    exact type, else the first entry (in insertion order) whose key it is an instance
    of. Containers not in the map are handled here, as torch does:

    * a ``Mapping`` gives the same mapping type (a copy of the first sample's mapping,
      updated), or a ``dict`` when that type cannot be rebuilt; keys come from the
      first sample and every sample must have them;
    * a namedtuple gives the same namedtuple type;
    * a ``Sequence`` is transposed (every sample must have the same length); a tuple
      gives a ``list`` (as in torch), other sequences their own type where possible.

    Args:
        batch: the samples (or, on recursion, the values of one field across them).
        collate_fn_map: element type -> ``fn(batch, *, collate_fn_map)``.

    Returns:
        The collated batch.

    Raises:
        CollateError: the samples disagree (shape, length, type, keys), or an element
            type has no collate function. The message names the field.

    Example:
        >>> collate([{"x": "a"}, {"x": "b"}], collate_fn_map={str: lambda b, **_: "".join(b)})
        {'x': 'ab'}
    """
    if len(batch) == 0:
        msg = f"cannot collate {_field()}: the batch is empty (0 samples)"
        raise CollateError(msg)
    elem = batch[0]
    fn = _lookup(elem, collate_fn_map)
    if fn is not None:
        try:
            return fn(batch, collate_fn_map=collate_fn_map)
        except CollateError:
            raise
        except Exception as exc:
            _add_note(exc, batch)
            raise
    if isinstance(elem, Mapping):
        return _collate_mapping(batch, collate_fn_map)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        _check_all(batch, tuple, "a namedtuple")
        _check_lengths(batch)
        return type(elem)(
            *(
                _collate_at("attr", name, [s[k] for s in batch], collate_fn_map)
                for k, name in enumerate(elem._fields)
            )
        )
    if isinstance(elem, Sequence) and not isinstance(elem, (str, bytes)):
        return _collate_sequence(batch, collate_fn_map)
    raise _unsupported_error(batch)


def _check_all(batch: Sequence[Any], cls: Any, expected: str) -> None:
    types = set(map(type, batch))
    if len(types) == 1:  # one isinstance check stands for the whole batch
        (kind,) = types
        if issubclass(kind, cls) and not issubclass(kind, (str, bytes)):
            return
    for i, s in enumerate(batch):
        if not isinstance(s, cls) or isinstance(s, (str, bytes)):
            raise _mixed_types_error(batch, i, expected)


def _check_lengths(batch: Sequence[Any]) -> None:
    n = len(batch[0])
    if len(set(map(len, batch))) == 1:
        return
    for i, s in enumerate(batch):
        if len(s) != n:
            msg = (
                f"cannot collate {_field()} (batch of {len(batch)}): sample 0 has {n} "
                f"elements but sample {i} has {len(s)}. Every sample must have the same "
                f"number of elements in a list or tuple field; use pad_collate for "
                f"variable-length sequences."
            )
            raise CollateError(msg)


def _collate_mapping(batch: Sequence[Any], collate_fn_map: Any) -> Any:
    elem = batch[0]
    _check_all(batch, Mapping, "a mapping")
    for i, s in enumerate(batch):
        missing = [k for k in elem if k not in s]
        if missing:
            msg = (
                f"cannot collate {_field()} (batch of {len(batch)}): sample {i} has no key "
                f"{missing[0]!r} (sample 0 has keys {list(elem)}). Return the same keys "
                f"from every sample."
            )
            raise CollateError(msg)
    values = {k: _collate_at("key", k, [s[k] for s in batch], collate_fn_map) for k in elem}
    try:
        if isinstance(elem, collections.abc.MutableMapping):
            clone = copy.copy(elem)
            clone.update(values)
            return clone
        return type(elem)(values)
    except TypeError:
        return values


def _collate_sequence(batch: Sequence[Any], collate_fn_map: Any) -> Any:
    elem = batch[0]
    _check_all(batch, Sequence, "a sequence")
    _check_lengths(batch)
    columns = [
        _collate_at("index", k, [s[k] for s in batch], collate_fn_map) for k in range(len(elem))
    ]
    if isinstance(elem, tuple):
        return columns
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for k, column in enumerate(columns):
                clone[k] = column
            return clone
        return type(elem)(columns)
    except TypeError:
        return columns


# ------------------------------------------------------------------ public entry points


def default_collate(batch: Sequence[Any]) -> Any:
    """Stacks a list of samples into a batch, like ``torch.utils.data.default_collate``.

    Input element type -> output (numpy where torch gives tensors):

    * ``torch.Tensor`` -> ``torch.stack`` (torch only when the elements are tensors)
    * numpy array -> ``np.stack`` (dtype promoted across samples); string and object
      arrays raise, as in torch
    * numpy scalar -> array of its dtype
    * ``int`` -> int64 array; ``bool`` -> bool array; ``float`` -> float64 array (a mix
      of ints and floats -> float64, where torch gives float32 when an int comes first)
    * ``str`` / ``bytes`` -> ``list`` (torch returns the tuple it built when nested)
    * ``Mapping`` / namedtuple / ``Sequence`` -> see :func:`collate`
    * :class:`~stoker.StackedSamples` -> ``[copy of column for column in columns]``,
      one vectorised copy per column; equal to collating the per-sample tuples
    * ``None`` or other types -> :class:`~stoker.CollateError`

    Inside :func:`collate_into`, the arrays are written into allocator memory.

    Args:
        batch: the samples.

    Returns:
        The batch.

    Example:
        >>> batch = default_collate([{"x": np.zeros(2), "y": 1}, {"x": np.ones(2), "y": 0}])
        >>> batch["x"].shape, batch["y"]
        ((2, 2), array([1, 0]))
    """
    if isinstance(batch, StackedSamples):
        return _collate_stacked(batch)
    return collate(batch, collate_fn_map=default_collate_fn_map)


def _collate_stacked(batch: StackedSamples) -> list[Any]:
    out = []
    for k, column in enumerate(batch.columns):
        if len(batch) and _lookup(column[0], default_collate_fn_map) not in _DEFAULT_FNS:
            out.append(_collate_at("index", k, [row for row in column], default_collate_fn_map))
        elif isinstance(column, np.ndarray) and not _STR_OBJ_DTYPE.search(column.dtype.str):
            target = _alloc(column.shape, column.dtype)
            if target is None:
                target = np.array(column, order="C", copy=True, subok=False)
            else:
                np.copyto(target, column)
            out.append(target)
        elif _is_tensor(column) and column.layout == _torch().strided:
            target = None
            if column.device.type == "cpu" and not column.requires_grad:
                target = _torch_alloc(tuple(column.shape), column.dtype)
            if target is None:
                out.append(column.clone(memory_format=_torch().contiguous_format))
            else:
                target.copy_(column)
                out.append(target)
        else:  # strings, objects, lists: collate the column's elements like samples
            out.append(_collate_at("index", k, [row for row in column], default_collate_fn_map))
    return out


def default_convert(data: Any) -> Any:
    """Like ``torch.utils.data.default_convert``, minus the conversion to tensors.

    stoker's core keeps numpy: arrays (and numpy scalars, strings, tensors) are
    returned as they are, and containers are rebuilt around their converted elements
    the way torch rebuilds them (a tuple becomes a list; a namedtuple, mapping or list
    keeps its type). :mod:`stoker.torch` provides the variant that makes tensors. This
    is what a loader applies to samples when automatic batching is off.

    Args:
        data: one sample.

    Returns:
        The converted sample.

    Example:
        >>> default_convert((np.arange(2), 3))
        [array([0, 1]), 3]
    """
    if isinstance(data, (np.ndarray, np.generic, str, bytes)) or _is_tensor(data):
        return data
    data_type: Any = type(data)
    if isinstance(data, Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                mapping = copy.copy(data)
                mapping.update({k: default_convert(data[k]) for k in data})
                return mapping
            return data_type({k: default_convert(data[k]) for k in data})
        except TypeError:
            return {k: default_convert(data[k]) for k in data}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return data_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                sequence = copy.copy(data)
                for i, d in enumerate(data):
                    sequence[i] = default_convert(d)
                return sequence
            return data_type([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data


@contextlib.contextmanager
def collate_into(allocator: Allocator | None) -> Iterator[None]:
    """Makes the collate functions of this module write their arrays into given memory.

    Inside the block, every numpy array that :func:`default_collate`,
    :class:`PadCollate` or :class:`RaggedCollate` creates for a batched field is
    obtained as ``allocator(shape, dtype)`` and filled in place (``np.stack(...,
    out=...)``, ``np.copyto``), instead of being allocated by numpy. CPU tensors with a
    numpy dtype are stacked into ``torch.from_numpy`` of such an array. The setting
    is per thread / per asyncio task (a context variable); ``None`` turns it off.
    Lists of strings and user-registered functions are not affected.

    Args:
        allocator: ``allocator(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray``
            returning a writeable array of exactly that shape and dtype, or ``None``.

    Example:
        >>> pool = np.zeros(1024, np.uint8)
        >>> def take(shape, dtype):
        ...     n = int(np.prod(shape)) * dtype.itemsize
        ...     return pool[:n].view(dtype).reshape(shape)
        >>> with collate_into(take):
        ...     out = default_collate([np.ones(3), np.ones(3)])
        >>> np.shares_memory(out, pool)
        True
    """
    if allocator is not None and not callable(allocator):
        msg = f"collate_into needs a callable allocator(shape, dtype) or None, got {allocator!r}"
        raise TypeError(msg)
    token = _ALLOCATOR.set(allocator)
    try:
        yield
    finally:
        _ALLOCATOR.reset(token)


# --------------------------------------------------------------- shared by pad / ragged


def _split_samples(
    batch: Sequence[Any], who: str, names: Sequence[Any] | None = None
) -> tuple[list[Any], list[Any], bool]:
    """(samples as dicts or sequences, their keys, whether the output is a dict)."""
    if len(batch) == 0:
        msg = f"{who} cannot collate an empty batch (0 samples)"
        raise CollateError(msg)
    samples = list(batch)
    first = samples[0]
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        samples = [s._asdict() if hasattr(s, "_asdict") else s for s in samples]
    elif names is not None and isinstance(first, (tuple, list)):
        for i, s in enumerate(samples):
            if not isinstance(s, (tuple, list)) or len(s) != len(names):
                got = f"{len(s)} elements" if isinstance(s, (tuple, list)) else _type_name(s)
                msg = f"{who}(names={list(names)}) needs samples of {len(names)} elements, "
                msg += f"but sample {i} has {got}"
                raise CollateError(msg)
        samples = [dict(zip(names, s, strict=True)) for s in samples]
    first = samples[0]
    if isinstance(first, Mapping):
        _check_all(samples, Mapping, "a mapping")
        keys = list(first)
        for i, s in enumerate(samples):
            missing = [k for k in keys if k not in s]
            if missing:
                msg = (
                    f"{who} cannot collate the samples (batch of {len(samples)}): sample {i} "
                    f"has no key {missing[0]!r} (sample 0 has keys {keys}). Return the same "
                    f"keys from every sample."
                )
                raise CollateError(msg)
        return samples, keys, True
    if isinstance(first, (tuple, list)):
        _check_all(samples, (tuple, list), "a tuple")
        _check_lengths(samples)
        return samples, list(range(len(first))), False
    msg = (
        f"{who} needs samples that are dicts or tuples of fields, got {_type_name(first)}. "
        f"Return e.g. {{'input_ids': ids}} or (ids, label) from the dataset."
    )
    raise CollateError(msg)


def _seg(key: Any, is_dict: bool) -> tuple[str, Any]:
    return ("key", key) if is_dict else ("index", key)


def _as_arrays(values: list[Any], who: str, min_ndim: int) -> tuple[list[Any], bool, Any]:
    """Field values as numpy arrays or tensors: (arrays, is_torch, dtype or None).

    Empty Python lists become ``None`` entries (their dtype and trailing shape come from
    the other samples). The path of the field must be set by the caller.
    """
    is_torch = _is_tensor(values[0])
    arrays: list[Any] = []
    for i, v in enumerate(values):
        if is_torch:
            if not _is_tensor(v):
                raise _mixed_types_error(values, i, "a torch.Tensor")
            a = v
        elif isinstance(v, np.ndarray):
            a = v
        elif isinstance(v, (list, tuple)) and not (v and isinstance(v[0], (str, bytes))):
            a = np.asarray(v) if len(v) else None
        else:
            msg = (
                f"{who} cannot pad or concatenate {_field()} (batch of {len(values)}): sample "
                f"{i} is {_type_name(v)}, which is not a sequence of numbers. Give it a numpy "
                f"array, a list of numbers or a tensor, or leave the field out of fields=."
            )
            raise CollateError(msg)
        if a is not None and not is_torch and _STR_OBJ_DTYPE.search(a.dtype.str):
            msg = (
                f"{who} cannot pad or concatenate {_field()} (batch of {len(values)}): sample "
                f"{i} holds values of dtype {a.dtype}, not numbers. Convert it to numbers in "
                f"the transform, or leave the field out of fields=."
            )
            raise CollateError(msg)
        if a is not None and a.ndim < min_ndim:
            msg = (
                f"{who} cannot pad or concatenate {_field()} (batch of {len(values)}): sample "
                f"{i} has shape {tuple(a.shape)}, which has no axis {min_ndim - 1}. Check "
                f"axis=, or leave the field out of fields=."
            )
            raise CollateError(msg)
        arrays.append(a)
    present = [a for a in arrays if a is not None]
    dtype = None
    if is_torch:
        torch = _torch()
        dtype = present[0].dtype
        for a in present[1:]:
            dtype = torch.promote_types(dtype, a.dtype)
    elif present:
        dtype = np.result_type(*[a.dtype for a in present])
    return arrays, is_torch, dtype


def _check_other_dims(arrays: list[Any], axis: int, who: str) -> tuple[int, ...] | None:
    """The shape without ``axis`` shared by all arrays (error naming samples if not)."""
    ref_i, ref, ref_shape = 0, None, ()
    for i, a in enumerate(arrays):
        if a is None:
            continue
        rest = tuple(a.shape[:axis]) + tuple(a.shape[axis + 1 :])
        if ref is None:
            ref_i, ref, ref_shape = i, rest, tuple(a.shape)
        elif rest != ref:
            msg = (
                f"{who} cannot pad or concatenate {_field()} (batch of {len(arrays)}): "
                f"sample {ref_i} has shape {ref_shape} but sample {i} has "
                f"shape {tuple(a.shape)}; they may differ only along axis {axis}."
            )
            raise CollateError(msg)
    return ref


def _new_filled(shape: tuple[int, ...], dtype: Any, fill: Any, is_torch: bool) -> Any:
    if is_torch:
        torch = _torch()
        out = _torch_alloc(shape, dtype)
        if out is None:
            return torch.full(shape, fill, dtype=dtype)
        out.fill_(fill)
        return out
    out_np = _empty(shape, dtype)
    out_np.fill(fill)
    return out_np


def _to_output(arr: np.ndarray, is_torch: bool) -> Any:
    return _torch().from_numpy(arr) if is_torch else arr


def _check_key(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Hashable):
        msg = f"{name} must be a hashable field name or None, got {value!r}"
        raise TypeError(msg)


def _key_list(name: str, value: Any, *, allow_none: bool) -> tuple[Any, ...] | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, set, frozenset)):
        msg = (
            f"{name} must be a list of field names (dict keys or tuple positions), got "
            f"{value!r}; pass e.g. {name}=[{value!r}]"
        )
        raise TypeError(msg)
    keys = tuple(value)
    if len(set(keys)) != len(keys):
        msg = f"{name} names a field twice: {list(keys)}"
        raise ValueError(msg)
    return keys


def _positive_int_or_none(name: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
    ):
        msg = f"{name} must be a positive integer or None, got {value!r}"
        raise ValueError(msg)


# ------------------------------------------------------------------------ PadCollate


@dataclass(frozen=True, slots=True)
class PadCollate:
    """Pads variable-length fields to the batch maximum; adds a mask and lengths.

    Samples are dicts (tokenizer outputs) or tuples such as ``(ids, label)``. Each
    padded field holds a numpy array, a list of numbers or a torch tensor per sample,
    whose size along ``axis`` varies; the other dimensions must agree. Every other
    field goes through :func:`default_collate`.

    Which fields are padded: ``fields`` if given (plus the fields in ``groups``);
    otherwise every top-level field whose value in the first sample is a list of
    numbers or an array/tensor with ``axis + 1`` dimensions (a 1-D sequence for
    ``axis=0``). This choice depends on the types, not on the lengths in the batch, so
    the output has the same keys and the same mask for every batch. List fields that
    are padded become arrays; with equal lengths, padding equals stacking.

    Mask and lengths describe the *primary field*: ``fields[0]``, else ``groups[0][0]``,
    else the first padded field in sample order. The mask is bool, shape
    ``(batch, padded length)``, True on real elements; lengths are int64 (after
    truncation). Fields of one group are padded to one common length (the longest in
    the group); other fields each get their own batch maximum. If the samples already
    carry a field named ``mask_key`` (as tokenizer outputs do), that field is padded in
    the primary field's group with 0 and kept as it is, and no new mask is made.

    Output: for dict samples a dict with the sample's keys, then ``mask_key`` and
    ``lengths_key``; for tuple samples a list of the collated fields followed by the
    mask and the lengths (a namedtuple sample is treated as a dict; ``names`` turns
    tuple samples into dicts first). Mask and lengths are torch tensors when the
    primary field holds tensors, numpy arrays otherwise.

    The pad value must be what the model expects: for token ids the tokenizer's
    ``pad_token_id`` (0 is a real token in many vocabularies), and typically -100 for
    labels ignored by the loss. A pad value the field's dtype cannot hold exactly
    (-100 in uint8, 0.5 in int64) raises; whether it also occurs as real data is not
    checked, since the mask tells padding apart.

    Args:
        pad_value: a number for every padded field, or a mapping from field to number
            (which must then name every padded field except ``mask_key``).
        fields: the fields to pad, or ``None`` to pick them as described above.
        side: ``"right"`` (pads at the end) or ``"left"`` (pads at the start, for
            decoder-only inference).
        groups: tuples of fields padded to one common length.
        axis: the variable dimension of each sample's field.
        mask_key: where to put the mask (dict samples), or ``None`` for no mask.
        lengths_key: where to put the lengths, or ``None`` for none.
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        max_length: truncate longer sequences to this length, keeping their first
            ``max_length`` elements (on either side). Must be a multiple of
            ``pad_to_multiple_of`` when both are set.
        names: names for the elements of tuple samples, to return a dict.

    Example:
        >>> collate_fn = PadCollate(pad_value={"input_ids": 0, "labels": -100})
        >>> batch = collate_fn([{"input_ids": [5, 6, 7], "labels": [1, 2, 3]},
        ...                     {"input_ids": [8], "labels": [4]}])
        >>> batch["input_ids"].tolist(), batch["labels"].tolist()
        ([[5, 6, 7], [8, 0, 0]], [[1, 2, 3], [4, -100, -100]])
        >>> batch["attention_mask"].tolist(), batch["lengths"].tolist()
        ([[True, True, True], [True, False, False]], [3, 1])
    """

    pad_value: Any = 0
    _: KW_ONLY
    fields: Sequence[Any] | None = None
    side: str = "right"
    groups: Sequence[Sequence[Any]] = ()
    axis: int = 0
    mask_key: Any = "attention_mask"
    lengths_key: Any = "lengths"
    pad_to_multiple_of: int | None = None
    max_length: int | None = None
    names: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        pad = self.pad_value
        if isinstance(pad, Mapping):
            for k, v in pad.items():
                if not _is_number(v):
                    msg = f"pad_value[{k!r}] must be a number, got {v!r}"
                    raise TypeError(msg)
            object.__setattr__(self, "pad_value", dict(pad))
        elif not _is_number(pad):
            msg = (
                f"pad_value must be a number or a mapping from field to number, got {pad!r}; "
                f"pass e.g. pad_value=tokenizer.pad_token_id"
            )
            raise TypeError(msg)
        object.__setattr__(self, "fields", _key_list("fields", self.fields, allow_none=True))
        if self.fields is not None and not self.fields:
            msg = "fields must name at least one field to pad, got []; pass None to pick them"
            raise ValueError(msg)
        if self.side not in ("left", "right"):
            msg = f'side must be "left" or "right", got {self.side!r}'
            raise ValueError(msg)
        if isinstance(self.groups, (str, bytes)) or not isinstance(self.groups, Sequence):
            msg = f"groups must be a list of tuples of field names, got {self.groups!r}"
            raise TypeError(msg)
        groups = tuple(_key_list("each group", g, allow_none=False) for g in self.groups)
        seen: set[Any] = set()
        for g in groups:
            if not g:
                msg = "groups must not contain an empty group"
                raise ValueError(msg)
            for k in g:
                if k in seen:
                    msg = f"field {k!r} is in more than one group of groups={self.groups!r}"
                    raise ValueError(msg)
                seen.add(k)
        object.__setattr__(self, "groups", groups)
        if isinstance(self.axis, bool) or not isinstance(self.axis, numbers.Integral):
            msg = f"axis must be a non-negative integer, got {self.axis!r}"
            raise TypeError(msg)
        if self.axis < 0:
            msg = f"axis must be a non-negative integer (an axis of one sample), got {self.axis}"
            raise ValueError(msg)
        _check_key("mask_key", self.mask_key)
        _check_key("lengths_key", self.lengths_key)
        if self.mask_key is not None and self.mask_key == self.lengths_key:
            msg = f"mask_key and lengths_key must differ, both are {self.mask_key!r}"
            raise ValueError(msg)
        _positive_int_or_none("pad_to_multiple_of", self.pad_to_multiple_of)
        _positive_int_or_none("max_length", self.max_length)
        m, cap = self.pad_to_multiple_of, self.max_length
        if m is not None and cap is not None and cap % m:
            msg = (
                f"max_length ({cap}) must be a multiple of pad_to_multiple_of ({m}); "
                f"pass max_length={-(-cap // m) * m} or {cap // m * m}"
            )
            raise ValueError(msg)
        object.__setattr__(self, "names", _key_list("names", self.names, allow_none=True))

    # -- helpers

    def _auto_field(self, value: Any) -> bool:
        if isinstance(value, np.ndarray) or _is_tensor(value):
            numeric = _is_tensor(value) or not _STR_OBJ_DTYPE.search(value.dtype.str)
            return numeric and value.ndim == self.axis + 1
        if isinstance(value, (list, tuple)) and self.axis == 0:
            return all(_is_number(x) for x in value)
        return False

    def _pad_for(self, key: Any, is_dict: bool) -> Any:
        pad = self.pad_value
        if isinstance(pad, dict):
            if key in pad:
                return pad[key]
            if is_dict and key == self.mask_key:
                return 0
            msg = (
                f"pad_value has no entry for the padded field {key!r}; add one, e.g. "
                f"pad_value={{**pad_value, {key!r}: 0}}"
            )
            raise ValueError(msg)
        return 0 if is_dict and key == self.mask_key else pad

    def _plan(self, first: Any, keys: list[Any], is_dict: bool) -> tuple[list[list[Any]], Any]:
        """(groups of padded fields, primary field)."""
        where = "the samples' keys" if is_dict else "the tuple positions"
        explicit = list(self.fields) if self.fields is not None else []
        grouped = [k for g in self.groups for k in g]
        for k in explicit + grouped:
            if k not in keys:
                msg = (
                    f"PadCollate names the field {k!r}, which is not one of {where} {keys}. "
                    f"Check fields= and groups=."
                )
                raise CollateError(msg)
        if self.fields is None:
            auto = [k for k in keys if self._auto_field(first[k])]
            padded = list(dict.fromkeys(auto + grouped))
        else:
            padded = list(dict.fromkeys(explicit + grouped))
        if self.fields:
            primary = self.fields[0]
        elif self.groups:
            primary = self.groups[0][0]
        elif padded:
            primary = padded[0]
        else:
            msg = (
                f"PadCollate found no variable-length field to pad in samples with {where} "
                f"{keys}: none holds a list of numbers or a {self.axis + 1}-D array. Name "
                f"the fields to pad with fields=[...]."
            )
            raise CollateError(msg)
        groups = [list(g) for g in self.groups]
        for k in padded:
            if k not in grouped:
                groups.append([k])
        if is_dict and self.mask_key in keys and self.mask_key != primary:
            for g in groups:
                if self.mask_key in g:
                    g.remove(self.mask_key)
            groups = [g for g in groups if g]
            next(g for g in groups if primary in g).append(self.mask_key)
        return groups, primary

    def __call__(self, batch: Sequence[Any]) -> Any:
        samples, keys, is_dict = _split_samples(batch, "PadCollate", self.names)
        if is_dict and self.lengths_key is not None and self.lengths_key in keys:
            msg = (
                f"the samples already have a field {self.lengths_key!r}, where PadCollate "
                f"puts the lengths; pass lengths_key=None or another name"
            )
            raise CollateError(msg)
        groups, primary = self._plan(samples[0], keys, is_dict)
        axis, n = self.axis, len(samples)
        out: dict[Any, Any] = {}
        primary_lengths: np.ndarray | None = None
        primary_torch, primary_len = False, 0
        for group in groups:
            prepared = []
            for k in group:
                with _at(*_seg(k, is_dict)):
                    arrays, is_torch, dtype = _as_arrays(
                        [s[k] for s in samples], "PadCollate", axis + 1
                    )
                    rest = _check_other_dims(arrays, axis, "PadCollate")
                    if dtype is None:  # only empty lists: take the pad value's dtype
                        dtype = np.asarray(self._pad_for(k, is_dict)).dtype
                    if rest is None:
                        rest = ()
                    lengths = np.array(
                        [0 if a is None else a.shape[axis] for a in arrays], dtype=np.int64
                    )
                    prepared.append((k, arrays, is_torch, dtype, rest, lengths))
            target = max(int(p[5].max()) for p in prepared)
            if self.pad_to_multiple_of is not None:
                target = -(-target // self.pad_to_multiple_of) * self.pad_to_multiple_of
            if self.max_length is not None:
                target = min(target, self.max_length)
            for k, arrays, is_torch, dtype, rest, lengths in prepared:
                with _at(*_seg(k, is_dict)):
                    lengths = np.minimum(lengths, target)
                    pad = self._check_pad(self._pad_for(k, is_dict), dtype, is_torch)
                    shape = (n, *rest[:axis], target, *rest[axis:])
                    padded = _new_filled(shape, dtype, pad, is_torch)
                    lead = (slice(None),) * axis
                    for i, a in enumerate(arrays):
                        m = int(lengths[i])
                        if a is None or m == 0:
                            continue
                        start = target - m if self.side == "left" else 0
                        padded[(i, *lead, slice(start, start + m))] = a[(*lead, slice(0, m))]
                    out[k] = padded
                    if k == primary:
                        primary_lengths, primary_torch, primary_len = lengths, is_torch, target
        if primary_lengths is None:
            raise AssertionError(f"PadCollate: primary field {primary!r} was not padded")
        token = _SHAPE_HINT.set(
            "Resize it in the transform, or list the field in PadCollate(fields=[...]) to pad "
            f"it along axis {axis}."
        )
        try:
            for k in keys:
                if k not in out:
                    with _at(*_seg(k, is_dict)):
                        out[k] = collate(
                            [s[k] for s in samples], collate_fn_map=default_collate_fn_map
                        )
        finally:
            _SHAPE_HINT.reset(token)
        extras = []
        if self.mask_key is not None and not (is_dict and self.mask_key in keys):
            mask = _empty((n, primary_len), np.bool_)
            positions = np.arange(primary_len)
            if self.side == "left":
                np.greater_equal(positions, (primary_len - primary_lengths)[:, None], out=mask)
            else:
                np.less(positions, primary_lengths[:, None], out=mask)
            extras.append((self.mask_key, _to_output(mask, primary_torch)))
        if self.lengths_key is not None:
            extras.append((self.lengths_key, _to_output(_finish(primary_lengths), primary_torch)))
        if is_dict:
            result = {k: out[k] for k in keys}
            result.update(extras)
            return result
        return [out[k] for k in keys] + [v for _, v in extras]

    @staticmethod
    def _check_pad(pad: Any, dtype: Any, is_torch: bool) -> Any:
        if is_torch:
            torch = _torch()
            inexact = dtype.is_floating_point or dtype.is_complex
            ok = inexact or torch.tensor(pad).to(dtype).item() == pad
        else:
            inexact = np.dtype(dtype).kind in "fcmM"
            try:
                with np.errstate(all="ignore"):
                    ok = inexact or bool(np.asarray(pad).astype(dtype) == pad)
            except (OverflowError, ValueError, TypeError):
                ok = False
        if not ok:
            msg = (
                f"cannot pad {_field()} with pad_value {pad!r}: its dtype {dtype} cannot hold "
                f"that value exactly. Pass a pad value of the field's type (for token ids, "
                f"the tokenizer's pad_token_id), or change the field's dtype."
            )
            raise ValueError(msg)
        return pad


def pad_collate(
    batch: Sequence[Any],
    pad_value: Any = 0,
    *,
    fields: Sequence[Any] | None = None,
    side: str = "right",
    groups: Sequence[Sequence[Any]] = (),
    axis: int = 0,
    mask_key: Any = "attention_mask",
    lengths_key: Any = "lengths",
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    names: Sequence[Any] | None = None,
) -> Any:
    """Pads a batch in one call: ``PadCollate(pad_value, ...)(batch)``.

    See :class:`PadCollate` for the arguments and output. To pass options to a
    DataLoader, use ``collate_fn=PadCollate(...)`` (it pickles to worker processes).

    Example:
        >>> ids, mask, lengths = pad_collate([(np.array([1, 2]),), (np.array([3]),)])
        >>> ids.tolist(), lengths.tolist()
        ([[1, 2], [3, 0]], [2, 1])
    """
    return PadCollate(
        pad_value,
        fields=fields,
        side=side,
        groups=groups,
        axis=axis,
        mask_key=mask_key,
        lengths_key=lengths_key,
        pad_to_multiple_of=pad_to_multiple_of,
        max_length=max_length,
        names=names,
    )(batch)


# --------------------------------------------------------------------- RaggedCollate


@dataclass(frozen=True, slots=True)
class RaggedCollate:
    """Concatenates variable-count fields (detection boxes) and adds a batch index.

    Each field in ``fields`` holds, per sample, ``N_i`` rows: an array or tensor of
    shape ``(N_i, ...)`` or a list (``[]`` or ``np.array([])`` for none). The fields of
    one sample must agree on ``N_i``; ``N_i = 0`` is fine (a field that is empty in every
    sample and has no array to take a dtype from comes out as int64 of shape ``(0,)``).
    They are concatenated along axis 0 to shape ``(sum N_i, ...)``, and the batch index
    (which sample each row came from) is added: as an int64 array of shape
    ``(sum N_i,)`` under ``batch_index_key`` (the ultralytics ``batch_idx`` style),
    and/or as an extra first column of the 2-D fields named in ``prepend_batch_index``
    (YOLOv5's ``targets`` layout; the index is cast to the field's dtype). Other fields
    go through :func:`default_collate`.

    Output: for dict samples a dict with the sample's keys, then ``batch_index_key``
    and ``counts_key``; for tuple samples (``fields`` are positions) a list followed by
    the batch index and counts. A namedtuple sample is treated as a dict. The batch
    index and counts are tensors when the first field holds tensors.

    Args:
        fields: the variable-count fields (dict keys or tuple positions).
        batch_index_key: where to put the batch index, or ``None``.
        prepend_batch_index: 2-D fields that get the batch index as column 0.
        counts_key: where to put ``N_i`` per sample (int64, shape ``(batch,)``), or
            ``None``.

    Example:
        >>> collate_fn = RaggedCollate(fields=("boxes", "labels"))
        >>> batch = collate_fn([
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.ones((2, 4)), "labels": [1, 2]},
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.zeros((0, 4)), "labels": []},
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.ones((1, 4)), "labels": [3]},
        ... ])
        >>> batch["image"].shape, batch["boxes"].shape, batch["batch_index"].tolist()
        ((3, 3, 4, 4), (3, 4), [0, 0, 2])
    """

    fields: Sequence[Any]
    _: KW_ONLY
    batch_index_key: Any = "batch_index"
    prepend_batch_index: Sequence[Any] = ()
    counts_key: Any = None

    def __post_init__(self) -> None:
        fields = _key_list("fields", self.fields, allow_none=False)
        if not fields:
            msg = "fields must name at least one variable-count field, got []"
            raise ValueError(msg)
        object.__setattr__(self, "fields", fields)
        prepend = _key_list("prepend_batch_index", self.prepend_batch_index, allow_none=False)
        object.__setattr__(self, "prepend_batch_index", prepend)
        for k in prepend or ():
            if k not in fields:
                msg = f"prepend_batch_index names {k!r}, which is not in fields={list(fields)}"
                raise ValueError(msg)
        _check_key("batch_index_key", self.batch_index_key)
        _check_key("counts_key", self.counts_key)
        for name in ("batch_index_key", "counts_key"):
            if getattr(self, name) in fields:
                msg = f"{name}={getattr(self, name)!r} is also in fields; pick another name"
                raise ValueError(msg)
        if self.batch_index_key is not None and self.batch_index_key == self.counts_key:
            msg = f"batch_index_key and counts_key must differ, both are {self.counts_key!r}"
            raise ValueError(msg)
        if self.batch_index_key is None and self.counts_key is None and not prepend:
            msg = (
                "RaggedCollate needs batch_index_key, counts_key or prepend_batch_index to "
                "keep track of which rows belong to which sample; all are unset"
            )
            raise ValueError(msg)

    def __call__(self, batch: Sequence[Any]) -> Any:
        samples, keys, is_dict = _split_samples(batch, "RaggedCollate")
        where = "the samples' keys" if is_dict else "the tuple positions"
        for k in self.fields:
            if k not in keys:
                msg = f"RaggedCollate(fields=...) names {k!r}, which is not one of {where} {keys}"
                raise CollateError(msg)
        for name in ("batch_index_key", "counts_key"):
            key = getattr(self, name)
            if is_dict and key is not None and key in keys:
                msg = (
                    f"the samples already have a field {key!r}, where RaggedCollate puts "
                    f"the {name[:-4].replace('_', ' ')}; pass {name}=None or another name"
                )
                raise CollateError(msg)
        n = len(samples)
        out: dict[Any, Any] = {}
        counts: np.ndarray | None = None
        first_field = None
        index_torch = False
        for k in self.fields:
            with _at(*_seg(k, is_dict)):
                arrays, is_torch, dtype = _as_arrays([s[k] for s in samples], "RaggedCollate", 1)
                # an empty 1-D array (np.array([])) means "no rows", whatever the row shape
                arrays = [None if a is not None and tuple(a.shape) == (0,) else a for a in arrays]
                rest = _check_other_dims(arrays, 0, "RaggedCollate") or ()
                if dtype is None:
                    dtype = np.dtype(np.int64)
                field_counts = np.array(
                    [0 if a is None else a.shape[0] for a in arrays], dtype=np.int64
                )
                if counts is None:
                    counts, first_field, index_torch = field_counts, k, is_torch
                else:
                    for i in np.flatnonzero(field_counts != counts):
                        msg = (
                            f"RaggedCollate: sample {i} has {counts[i]} rows in "
                            f"{_format_path((_seg(first_field, is_dict),))} but "
                            f"{field_counts[i]} in {_field()}; the fields of one sample must "
                            f"have one row per object."
                        )
                        raise CollateError(msg)
                prepend = k in (self.prepend_batch_index or ())
                if prepend and len(rest) != 1:
                    msg = (
                        f"RaggedCollate can prepend the batch index only to 2-D fields, but "
                        f"{_field()} has rows of shape {rest}"
                    )
                    raise CollateError(msg)
                out[k] = self._concat(arrays, counts, is_torch, dtype, rest, prepend)
        if counts is None:
            raise AssertionError("RaggedCollate: no field was concatenated")
        for k in keys:
            if k not in out:
                with _at(*_seg(k, is_dict)):
                    out[k] = collate([s[k] for s in samples], collate_fn_map=default_collate_fn_map)
        extras = []
        if self.batch_index_key is not None:
            index = _empty((int(counts.sum()),), np.int64)
            index[:] = np.repeat(np.arange(n, dtype=np.int64), counts)
            extras.append((self.batch_index_key, _to_output(index, index_torch)))
        if self.counts_key is not None:
            extras.append((self.counts_key, _to_output(_finish(counts), index_torch)))
        if is_dict:
            result = {k: out[k] for k in keys}
            result.update(extras)
            return result
        return [out[k] for k in keys] + [v for _, v in extras]

    @staticmethod
    def _concat(
        arrays: list[Any],
        counts: np.ndarray,
        is_torch: bool,
        dtype: Any,
        rest: tuple[int, ...],
        prepend: bool,
    ) -> Any:
        total = int(counts.sum())
        width = (rest[0] + 1,) if prepend else rest
        rows = [a for a in arrays if a is not None and a.shape[0]]
        index = np.repeat(np.arange(len(arrays)), counts)
        if is_torch:
            torch = _torch()
            out = _torch_alloc((total, *width), dtype)
            if out is None:
                out = torch.empty((total, *width), dtype=dtype)
            if prepend:
                out[:, 0] = torch.from_numpy(index).to(dtype)
                if rows:
                    out[:, 1:] = torch.cat(rows, 0)
            elif rows:
                torch.cat(rows, 0, out=out)
            return out
        out_np = _empty((total, *width), dtype)
        body_np = out_np[:, 1:] if prepend else out_np
        if rows:
            np.concatenate(rows, axis=0, out=body_np)
        if prepend:
            out_np[:, 0] = index
        return out_np
