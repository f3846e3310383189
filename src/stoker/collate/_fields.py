"""Helpers shared by the padding and ragged collates: splitting samples into fields,
checking and converting their values, building outputs."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._errors import CollateError
from stoker.collate._registry import (
    _STR_OBJ_DTYPE,
    _check_all,
    _check_keys,
    _check_lengths,
    _empty,
    _field,
    _is_tensor,
    _mixed_types_error,
    _promoted_dtype,
    _same_type,
    _torch,
    _torch_alloc,
    _type_name,
)

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
        _check_keys(samples, who)
        return samples, list(first), True
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
    fast = _as_arrays_fast(values, min_ndim)
    if fast is not None:
        return fast
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


def _as_arrays_fast(values: list[Any], min_ndim: int) -> tuple[list[Any], bool, Any] | None:
    """:func:`_as_arrays` for the common batch, checked per distinct type and dtype rather
    than per sample: every value a numpy array of numbers, or every value a tensor, with
    at least ``min_ndim`` dimensions. None for anything else (the per-sample checks then
    name the sample at fault)."""
    kind = type(values[0])
    if not _same_type(values, kind):
        return None
    if kind is np.ndarray:
        dtypes = {a.dtype for a in values}
        if any(_STR_OBJ_DTYPE.search(d.str) for d in dtypes):
            return None
        dtype = np.result_type(*dtypes)
    elif _is_tensor(values[0]):
        dtype = _promoted_dtype(values)
    else:
        return None
    if min(a.ndim for a in values) < min_ndim:
        return None
    return list(values), kind is not np.ndarray, dtype


def _check_other_dims(arrays: list[Any], axis: int, who: str) -> tuple[int, ...] | None:
    """The shape without ``axis`` shared by all arrays (error naming samples if not)."""
    shapes = {a.shape for a in arrays if a is not None}  # tuples, or torch.Size (a tuple)
    rests = {tuple(shape[:axis]) + tuple(shape[axis + 1 :]) for shape in shapes}
    if len(rests) == 1:  # the common case: one check for the whole batch
        return rests.pop()
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


def _assemble(
    out: dict[Any, Any], keys: Sequence[Any], is_dict: bool, extras: list[tuple[Any, Any]]
) -> Any:
    """The collated fields in the samples' order, then the extra outputs (mask, lengths,
    batch index...): a dict for dict samples, else a list with the extras appended."""
    if is_dict:
        result = {k: out[k] for k in keys}
        result.update(extras)
        return result
    return [out[k] for k in keys] + [v for _, v in extras]
