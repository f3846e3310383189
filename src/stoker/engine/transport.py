"""Encoding a collated batch for the trip from a process worker to the trainer.

The batch is pickled with a ``persistent_id`` hook: every numpy array (and CPU torch
tensor) large enough to matter is replaced by a reference into the task's shared-memory
slot (collate already wrote most of them there), so only a few hundred bytes of
structure cross the pipe. On the trainer's side ``persistent_load`` turns each reference
back into a zero-copy view of the leased slot. Arrays smaller than
:data:`INLINE_MAX_BYTES`, object arrays and arrays that do not fit travel inside the
pickle.

A CPU tensor that travels inside the pickle does so as the numpy array it views, rebuilt
with ``torch.from_numpy``: torch's own pickling of a tensor costs about 35 us at each end
however small the tensor (a batch's labels, lengths and ids are three of them), against
2-3 us for the array.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stoker.engine import shm
from stoker.engine.shm import SlotAllocator

__all__ = ["INLINE_MAX_BYTES", "SHM_MIN_BATCH_BYTES", "UnreadableAnswer", "array_bytes", "decode", "encode"]

INLINE_MAX_BYTES = 2048  # a smaller array travels inside the pickle
SHM_MIN_BATCH_BYTES = 64 * 1024  # a smaller batch travels inline: a pipe write beats a segment
_NDARRAY = np.ndarray
_INLINE_TENSOR = "ti"  # persistent id of a CPU tensor sent inline as its numpy array


def encode(message: Any, allocator: SlotAllocator | shm.OneoffWriter | None) -> bytes:
    """Pickles ``message``, moving its large arrays into ``allocator``'s slot when given."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    torch = sys.modules.get("torch")
    tensor_type = torch.Tensor if torch is not None else None
    if allocator is None and tensor_type is None:
        pickler.dump(message)
        return buffer.getvalue()
    slot_key: int | tuple[Any, ...] | None = None
    if allocator is not None:
        slot_key = allocator.ref.index
        if slot_key == -1:  # a one-off segment: the trainer finds it by name, then unlinks it
            slot_key = (allocator.ref.name, allocator.ref.size)
        elif slot_key == -2:  # a shared segment (a dataset sent to spawned workers): kept
            slot_key = (allocator.ref.name, allocator.ref.size, True)

    def persistent_id(obj: Any) -> Any:
        kind = type(obj)
        if kind is _NDARRAY:
            array, tag = obj, "n"
        elif kind is tensor_type and obj.device.type == "cpu":
            array, tag = _tensor_array(obj), "t"
            if array is None:
                return None
        else:
            return None
        if allocator is not None and array.nbytes >= INLINE_MAX_BYTES:
            offset = allocator.place(array)
            if offset is not None:
                return (tag, slot_key, offset, array.shape, _dtype_token(array.dtype))
        return (_INLINE_TENSOR, array) if tag == "t" else None

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


def decode(payload: bytes, lease: Callable[[int], object]) -> tuple[Any, set[Any]]:
    """Unpickles a message; returns it and the shared memory whose views it holds.

    ``lease(slot_index)`` is called once per pool slot that the message references and
    returns the buffer the arrays view (see :meth:`SlotPool.lease`); one-off segments
    are mapped and unlinked here. The returned set holds the pool slot indices (ints)
    and the ``(name, size)`` of the one-off segments the message's arrays view.
    """
    leases: dict[Any, object] = {}
    failures: list[OSError] = []
    unpickler = pickle.Unpickler(io.BytesIO(payload))

    def persistent_load(ref: tuple[Any, ...]) -> Any:
        if ref[0] == _INLINE_TENSOR:
            import torch

            array = ref[1]
            return torch.from_numpy(array if array.flags.writeable else array.copy())
        tag, slot_key, offset, shape, dtype_token = ref
        buffer = leases.get(slot_key)
        if buffer is None:
            try:
                if isinstance(slot_key, tuple) and len(slot_key) == 3:
                    buffer = leases[slot_key] = shm.map_shared(slot_key[0], slot_key[1])
                elif isinstance(slot_key, tuple):
                    buffer = leases[slot_key] = shm.lease_oneoff(*slot_key)
                else:
                    buffer = leases[slot_key] = lease(slot_key)
            except OSError as exc:  # read the rest of the message, so its task is known
                failures.append(exc)
                return None
        dtype = np.dtype(dtype_token)
        count = 1
        for n in shape:
            count *= n
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)  # type: ignore[call-overload]
        if tag == "t":
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
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.nbytes < INLINE_MAX_BYTES:
            return 0, 0
        return obj.nbytes, 1
    if hasattr(obj, "numpy") and hasattr(obj, "element_size"):  # a torch tensor
        nbytes = obj.numel() * obj.element_size()
        return (nbytes, 1) if nbytes >= INLINE_MAX_BYTES else (0, 0)
    if isinstance(obj, Mapping):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return 0, 0
    total = count = 0
    for item in obj:
        nbytes, n = array_bytes(item)
        total += nbytes
        count += n
    return total, count
