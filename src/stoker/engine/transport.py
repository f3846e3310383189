"""Encoding a collated batch for the trip from a process worker to the trainer.

The batch is pickled with a ``persistent_id`` hook: every numpy array (and CPU torch
tensor) large enough to matter is replaced by an :class:`ArrayRef` into the task's shared
memory (collate already wrote most of them there), so only a few hundred bytes of
structure cross the pipe. On the trainer's side ``persistent_load`` turns each reference
back into a zero-copy view of the leased slot. Arrays smaller than
:data:`INLINE_MAX_BYTES`, object arrays and arrays that do not fit travel inside the
pickle.

A CPU tensor that travels inside the pickle does so as the numpy array it views
(:class:`InlineTensor`), rebuilt with ``torch.from_numpy``: torch's own pickling of a
tensor costs about 35 us at each end however small the tensor (a batch's labels, lengths
and ids are three of them), against 2-3 us for the array.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._tree import leaves
from stoker.engine import segments
from stoker.engine.slots import OneoffWriter, SlotAllocator, SlotKind, SlotRef

__all__ = [
    "INLINE_MAX_BYTES",
    "SHM_MIN_BATCH_BYTES",
    "ArrayRef",
    "InlineTensor",
    "UnreadableAnswer",
    "array_bytes",
    "decode",
    "encode",
]

INLINE_MAX_BYTES = 2048  # a smaller array travels inside the pickle
SHM_MIN_BATCH_BYTES = 64 * 1024  # a smaller batch travels inline: a pipe write beats a segment
_NDARRAY = np.ndarray


def _reduce(self: Any) -> tuple[Any, tuple[Any, ...]]:
    return type(self), tuple([getattr(self, name) for name in self.__slots__])


@dataclass(frozen=True, slots=True)
class ArrayRef:
    """An array (or a CPU tensor's data) that lies in shared memory: where, and what it is."""

    memory: SlotRef
    offset: int
    shape: tuple[int, ...]
    dtype: Any  # the dtype's short string when that rebuilds it exactly, else the dtype
    tensor: bool  # rebuild it as a torch tensor over the array

    __reduce__ = _reduce


@dataclass(frozen=True, slots=True)
class InlineTensor:
    """A small CPU tensor that travels inside the pickle as the numpy array it views."""

    array: np.ndarray

    __reduce__ = _reduce


def encode(message: Any, allocator: SlotAllocator | OneoffWriter | None) -> bytes:
    """Pickles ``message``, moving its large arrays into ``allocator``'s memory when given."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    torch = sys.modules.get("torch")
    tensor_type = torch.Tensor if torch is not None else None
    if allocator is None and tensor_type is None:
        pickler.dump(message)
        return buffer.getvalue()
    memory = allocator.ref if allocator is not None else None

    def persistent_id(obj: Any) -> Any:
        kind = type(obj)
        if kind is _NDARRAY:
            array, tensor = obj, False
        elif kind is tensor_type and obj.device.type == "cpu":
            array, tensor = _tensor_array(obj), True
            if array is None:
                return None
        else:
            return None
        if allocator is not None and array.nbytes >= INLINE_MAX_BYTES:
            offset = allocator.place(array)
            if offset is not None:
                return ArrayRef(memory, offset, array.shape, _dtype_token(array.dtype), tensor)
        return InlineTensor(array) if tensor else None

    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    pickler.dump(message)
    return buffer.getvalue()


_DTYPE_TOKENS: dict[np.dtype, Any] = {}


def _dtype_token(dtype: np.dtype) -> Any:
    """What names ``dtype`` in a reference: its short string when that rebuilds it exactly,
    else the dtype itself (a structured dtype's string is ``|V12``, without its fields)."""
    token = _DTYPE_TOKENS.get(dtype)
    if token is None:
        token = _DTYPE_TOKENS[dtype] = dtype.str if np.dtype(dtype.str) == dtype else dtype
    return token


def _tensor_array(tensor: Any) -> np.ndarray | None:
    """The numpy array a plain CPU tensor views, or None for one that must pickle as itself."""
    if tensor.requires_grad or tensor.is_sparse or tensor.is_quantized or tensor.is_nested:
        return None
    if tensor.__dict__:  # attributes set on the tensor: torch's pickling keeps them
        return None
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):  # bfloat16 and friends, conjugate views
        return None


class UnreadableAnswer(Exception):
    """A message was read but its arrays could not be mapped; carries the message (for its
    task id), the shared memory it did lease, and the mapping error as ``__cause__``."""

    def __init__(self, message: Any, leased: set[Any]) -> None:
        super().__init__("a worker's answer could not be mapped")
        self.message = message
        self.leased = leased


def _map(memory: SlotRef, lease: Callable[[int], object]) -> object:
    if memory.kind is SlotKind.POOL:
        return lease(memory.index)
    if memory.kind is SlotKind.ONEOFF:
        return segments.lease_oneoff(memory.name, memory.size)
    return segments.map_shared(memory.name, memory.size)


def decode(payload: bytes, lease: Callable[[int], object]) -> tuple[Any, set[Any]]:
    """Unpickles a message; returns it and the shared memory whose views it holds.

    ``lease(slot_index)`` is called once per pool slot that the message references and
    returns the buffer the arrays view (see :meth:`SlotPool.lease`); one-off segments
    are mapped and unlinked here. The returned set holds the pool slot indices (ints)
    and the names of the other segments the message's arrays view.
    """
    leases: dict[Any, object] = {}
    failures: list[OSError] = []
    unpickler = pickle.Unpickler(io.BytesIO(payload))

    def persistent_load(ref: ArrayRef | InlineTensor) -> Any:
        if type(ref) is InlineTensor:
            import torch

            array = ref.array
            return torch.from_numpy(array if array.flags.writeable else array.copy())
        memory = ref.memory
        key = memory.index if memory.kind is SlotKind.POOL else memory.name
        buffer = leases.get(key)
        if buffer is None:
            try:
                buffer = leases[key] = _map(memory, lease)
            except OSError as exc:  # read the rest of the message, so its task is known
                failures.append(exc)
                return None
        dtype = np.dtype(ref.dtype)
        count = 1
        for n in ref.shape:
            count *= n
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=ref.offset).reshape(
            ref.shape
        )  # type: ignore[call-overload]
        if ref.tensor:
            import torch

            return torch.from_numpy(array)
        return array

    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    message = unpickler.load()
    if failures:
        raise UnreadableAnswer(message, set(leases)) from failures[0]
    return message, set(leases)


def array_bytes(obj: Any) -> tuple[int, int]:
    """(bytes, count) of the shared-memory-worthy arrays and tensors in a batch tree."""
    total = count = 0
    for leaf in leaves(obj):
        nbytes = _shared_bytes(leaf)
        if nbytes:
            total += nbytes
            count += 1
    return total, count


def _shared_bytes(leaf: Any) -> int:
    """The bytes of an array or tensor that would travel in shared memory, else 0."""
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.hasobject or leaf.nbytes < INLINE_MAX_BYTES:
            return 0
        return leaf.nbytes
    if hasattr(leaf, "numpy") and hasattr(leaf, "element_size"):  # a torch tensor
        nbytes = leaf.numel() * leaf.element_size()
        return nbytes if nbytes >= INLINE_MAX_BYTES else 0
    return 0
