"""The collate registry and the default collate: what ``stoker.collate`` is built on.

:data:`default_collate_fn_map` maps an element type (or a tuple of types) to a function
``fn(batch, *, collate_fn_map)``; :func:`register_collate` adds to it. :func:`collate`
dispatches on the type of the batch's first element (exact type first, then
``isinstance`` over the map in order) and recurses into mappings, namedtuples and
sequences, rebuilding them with :mod:`stoker._tree`'s rules. :func:`default_collate` is
:func:`collate` with the default map; :func:`default_convert` is what a loader applies
when automatic batching is off; :func:`collate_into` makes every batched array be
written into memory an allocator hands out.

The pieces the variable-size collates (``padding``, ``ragged`` and their ``_fields``)
share with the default one live here too, so that they import this module and nothing
imports back: the path of the field being collated (``_at``, ``_field``) and the error
messages that name it, the allocator (``_alloc``, ``_empty``, ``_finish``,
``_torch_alloc``), and the torch helpers that never import torch (``_torch``,
``_is_tensor``, ``_TorchTensor``, the registry key that matches tensors).
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._errors import CollateError
from stoker._stacked import StackedSamples
from stoker._tree import is_namedtuple, rebuild, rebuild_with

__all__ = [
    "collate",
    "collate_into",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
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


_NUMBER_TYPES = (bool, int, float, np.bool_, np.number)


def _is_number(x: object) -> bool:
    return isinstance(x, _NUMBER_TYPES)


# ------------------------------------------------------------------ leaf collate fns


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _promoted_dtype(tensors: Sequence[Any]) -> Any:
    """torch's promotion of the tensors' dtypes, each distinct dtype once, in sample order."""
    torch = _torch()
    dtypes = list(dict.fromkeys(map(_DTYPE, tensors)))
    dtype = dtypes[0]
    for d in dtypes[1:]:
        dtype = torch.promote_types(dtype, d)
    return dtype


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
    if not _same_type(batch, torch.Tensor):
        for i, t in enumerate(batch):
            if not isinstance(t, torch.Tensor):
                raise _mixed_types_error(batch, i, "a torch.Tensor")
    if len(set(map(_SHAPE, batch))) != 1:  # map(attrgetter): no Python frame per sample
        _check_same_shape(batch, [tuple(t.shape) for t in batch])
    out = None
    if elem.device.type == "cpu" and not any(map(_REQUIRES_GRAD, batch)):
        out = _torch_alloc((len(batch), *elem.shape), _promoted_dtype(batch))
    return torch.stack(list(batch), 0, out=out)


def _collate_ndarray(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    elem = batch[0]
    if _same_type(batch, np.ndarray) and not _STR_OBJ_DTYPE.search(elem.dtype.str):
        dtypes = {a.dtype for a in batch}
        shapes = {a.shape for a in batch}
        if len(dtypes) == 1 and len(shapes) == 1:  # the common case: validated in bulk
            # np.stack's own result dtype (native byte order), so a batch built in a worker's
            # slot has the dtype of one built in the main process
            out = np.stack(batch, out=_alloc((len(batch), *elem.shape), np.result_type(elem.dtype)))
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
    dtype = np.result_type(*[np.asarray(a).dtype for a in batch])
    out = np.stack(batch, out=_alloc((len(batch), *elem.shape), dtype))
    return out if type(out) is np.ndarray else out.view(np.ndarray)


def _collate_numpy_scalar(batch: Sequence[Any], *, collate_fn_map: Any = None) -> np.ndarray:
    if not _same_type(batch, type(batch[0])):  # one type (the first's, a number): all numbers
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
    if is_namedtuple(elem):
        _check_all(batch, tuple, "a namedtuple")
        _check_lengths(batch)
        fields = [
            _collate_at("attr", name, [s[k] for s in batch], collate_fn_map)
            for k, name in enumerate(elem._fields)
        ]
        return rebuild_with(elem, fields)
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


def _check_keys(batch: Sequence[Any], who: str | None = None) -> None:
    """Every mapping in ``batch`` has the keys of the first (an error naming the sample if not).

    ``who`` names the collate in the message; without it the message names the field.
    """
    keys = list(batch[0])
    for i, s in enumerate(batch):
        missing = [k for k in keys if k not in s]
        if missing:
            what = f"{who} cannot collate the samples" if who else f"cannot collate {_field()}"
            msg = (
                f"{what} (batch of {len(batch)}): sample {i} has no key {missing[0]!r} "
                f"(sample 0 has keys {keys}). Return the same keys from every sample."
            )
            raise CollateError(msg)


def _collate_mapping(batch: Sequence[Any], collate_fn_map: Any) -> Any:
    elem = batch[0]
    _check_all(batch, Mapping, "a mapping")
    _check_keys(batch)
    values = {k: _collate_at("key", k, [s[k] for s in batch], collate_fn_map) for k in elem}
    return rebuild_with(elem, values)


def _collate_sequence(batch: Sequence[Any], collate_fn_map: Any) -> Any:
    elem = batch[0]
    _check_all(batch, Sequence, "a sequence")
    _check_lengths(batch)
    columns = [
        _collate_at("index", k, [s[k] for s in batch], collate_fn_map) for k in range(len(elem))
    ]
    return rebuild_with(elem, columns, tuple_as_list=True)


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
    # not _tree.map_leaves: torch's default_convert descends into ranges and byte buffers too
    if isinstance(data, (Mapping, Sequence)):
        return rebuild(data, default_convert, tuple_as_list=True)
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
