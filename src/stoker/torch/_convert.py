"""numpy batches to torch batches: every array and numeric numpy scalar becomes a tensor.

Containers are rebuilt by :func:`stoker._tree.rebuild`, with the rules of torch's
``pin_memory`` (a tuple keeps its type).
"""

from __future__ import annotations

import collections.abc
from typing import Any

import numpy as np
import torch

from stoker._tree import is_container, rebuild

__all__ = ["to_tensors"]

# The dtypes torch.from_numpy accepts (torch/csrc/utils/tensor_numpy.cpp).
_TORCH_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "float64", "float32", "float16", "complex64", "complex128", "int64", "int32",
        "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    )
)  # fmt: skip


def _array_to_tensor(array: np.ndarray) -> Any:
    """A tensor over ``array``'s memory; a copy when torch cannot share it without a warning."""
    dtype = array.dtype
    native = dtype.newbyteorder("=") if not dtype.isnative else dtype
    if native not in _TORCH_DTYPES:
        return array  # strings, objects, datetimes, long doubles: torch has no such tensor
    strides_ok = all(s >= 0 and s % dtype.itemsize == 0 for s in array.strides)
    if not (array.flags.writeable and dtype.isnative and strides_ok):
        # torch warns about read-only arrays and refuses negative strides and foreign
        # byte order; a private, contiguous, native copy has none of these problems
        array = np.array(array, dtype=native, order="C", copy=True)
    return torch.from_numpy(array)


def to_tensors(data: Any, *, torch_strings: bool, in_sequence: bool = False) -> Any:
    """Every numpy array and numeric numpy scalar in the batch tree, as torch tensors.

    With ``torch_strings`` a list of strings that sits directly in a list, tuple or
    namedtuple becomes a tuple: torch's ``default_collate`` builds those from
    ``zip(*batch)`` and returns them as it built them, where stoker's returns lists.
    """
    if isinstance(data, np.ndarray):
        return _array_to_tensor(data)
    if isinstance(data, (np.number, np.bool_)):
        converted = _array_to_tensor(np.asarray(data))
        return data if isinstance(converted, np.ndarray) else converted
    if not is_container(data):
        return data
    # walked level by level rather than by _tree.map_leaves: a list of strings is converted
    # whole, and how depends on the container it sits in
    if (
        torch_strings
        and in_sequence
        and type(data) is list
        and data
        and all(isinstance(v, (str, bytes)) for v in data)
    ):
        return tuple(data)
    child_in_sequence = not isinstance(data, collections.abc.Mapping)
    return rebuild(
        data, lambda v: to_tensors(v, torch_strings=torch_strings, in_sequence=child_in_sequence)
    )
