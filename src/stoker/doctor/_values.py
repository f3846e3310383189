"""Samples as fields: walking a sample's leaves, describing each, and telling images apart.

A sample (or a batch) is a tree of mappings, tuples and lists; its leaves are arrays,
tensors, images, numbers or strings. Each leaf has a path of keys and indices, shown as
``sample[0]`` or ``sample['image']``. Internal to :mod:`stoker.doctor`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from stoker._tree import walk

FieldPath = tuple[Any, ...]

_LABEL_NAMES = ("label", "labels", "target", "targets", "y", "cls", "class")  # cls: webdataset


def field_name(path: FieldPath) -> str:
    return "sample" + "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in path)


def leaves(value: Any) -> list[tuple[FieldPath, Any]]:
    """Every leaf of a sample (or batch) with its path of keys and indices.

    A list of strings (a collated batch of them) and an empty list are one leaf each.
    """
    return list(walk(value, is_leaf=_one_field))


def _one_field(container: Any) -> bool:
    """An empty sequence, or one of strings only: described as one field."""
    return not isinstance(container, Mapping) and all(
        isinstance(v, (str, bytes)) for v in container
    )


def get(value: Any, path: FieldPath) -> Any:
    for key in path:
        value = value[key]
    return value


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, (str, bytes))


def as_array(value: Any) -> np.ndarray | None:
    """A numpy view of an array-like leaf (numpy, torch, PIL, a number), else None."""
    if isinstance(value, np.ndarray):
        return value
    if _is_scalar(value):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "getbands"):
        return np.asarray(value)
    return None


def is_int_scalar(value: Any) -> bool:
    array = as_array(value)
    return (
        array is not None
        and array.ndim == 0
        and array.dtype.kind in "iu"
        and not isinstance(value, bool)
    )


def layout(shape: tuple[int, ...]) -> str | None:
    """``"CHW"``, ``"HWC"`` or ``"HW"`` for an image-shaped array, else None."""
    if len(shape) == 2 and min(shape) >= 8:
        return "HW"
    if len(shape) == 3:
        if shape[0] in (1, 3, 4) and min(shape[1:]) >= 8:
            return "CHW"
        if shape[-1] in (1, 3, 4) and min(shape[:2]) >= 8:
            return "HWC"
    return None


def is_image(array: np.ndarray) -> bool:
    return layout(array.shape) is not None and (array.dtype == np.uint8 or array.dtype.kind == "f")


def describe(value: Any) -> tuple[str, dict[str, Any]]:
    """One line about a leaf, and its figures."""
    array = as_array(value)
    if array is None:
        kind = type(value).__name__
        if isinstance(value, (str, bytes)):
            return f"{kind} of length {len(value)}", {"type": kind, "length": len(value)}
        if isinstance(value, (list, tuple)):
            items = sorted({type(v).__name__ for v in value})
            return f"{kind} of {len(value)} {'/'.join(items) or 'items'}", {
                "type": kind,
                "length": len(value),
            }
        return kind, {"type": kind}
    data: dict[str, Any] = {
        "type": type(value).__name__,
        "dtype": str(array.dtype),
        "shape": list(array.shape),
    }
    kind = type(value).__name__
    # a scalar reads 'int64 = 3' or 'int = 3'; 'Tensor (int64) = 3' names both
    plain = kind == str(array.dtype) or isinstance(value, (bool, int, float))
    head = (
        f"{array.dtype} {tuple(array.shape)}"
        if array.ndim
        else (kind if plain else f"{kind} ({array.dtype})")
    )
    if array.size == 0 or array.dtype.kind not in "biuf":
        return head + (" (empty)" if array.size == 0 else ""), data
    if array.ndim == 0:
        data["value"] = array.item()
        return f"{head} = {array.item()!r}", data
    as_float = array.astype(np.float64, copy=False)
    finite = np.isfinite(as_float)
    values = as_float[finite] if not finite.all() else as_float
    if values.size:
        data.update(
            min=float(values.min()),
            max=float(values.max()),
            mean=float(values.mean()),
            std=float(values.std()),
        )
        head += (
            f"  min {data['min']:.4g}  max {data['max']:.4g}  mean {data['mean']:.4g}  std "
            f"{data['std']:.4g}"
        )
    if not finite.all():
        data["non_finite"] = int((~finite).sum())
        head += f"  ({data['non_finite']} NaN/inf)"
    return head, data


def label_path(sample: Any) -> FieldPath | None:
    """The label field: an int field named label/target/y, or a tuple's last int element."""
    if isinstance(sample, Mapping):
        for key in sample:
            if isinstance(key, str) and key.lower() in _LABEL_NAMES and is_int_scalar(sample[key]):
                return (key,)
        return None
    if isinstance(sample, (tuple, list)):
        for k in range(len(sample) - 1, -1, -1):
            if is_int_scalar(sample[k]):
                return (k,)
    return None


def fingerprint(value: Any) -> str:
    digest = hashlib.sha1()
    for path, leaf in leaves(value):
        digest.update(repr(path).encode())
        array = as_array(leaf)
        if array is not None:
            digest.update(str(array.dtype).encode() + repr(array.shape).encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        else:
            digest.update(leaf if isinstance(leaf, bytes) else repr(leaf).encode())
    return digest.hexdigest()


def same(a: Any, b: Any) -> bool:
    return fingerprint(a) == fingerprint(b)
