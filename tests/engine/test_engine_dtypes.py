"""Every dtype numpy can hold arrives exactly as it went in, by every way a batch travels.

A process worker's batch travels inside the pipe's pickle (small batches), through a
one-off shared-memory segment (large batches before the slot pool exists: an epoch's
first ones), or through a pool slot (the rest); thread workers hand the batch over as it
is. Each dtype goes through all of them and must come out with its dtype (fields, units
and byte order included) and values.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from stoker import DataLoader

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "longdouble", "complex64", "complex128", "clongdouble",
    ">i4", ">f8", "<U7", ">U3", "S5", "V4",
    "datetime64[ns]", "datetime64[D]", "timedelta64[s]",
    [("a", "<i4"), ("b", "<f8")],
    [("xy", "<f4", (2,)), ("name", "S3"), ("when", "<M8[s]")],
    [("big", ">i8"), ("nested", [("u", "u1"), ("v", "<i2")])],
]  # fmt: skip
SMALL, LARGE = (
    (3,),
    (16384,),
)  # a batch of 4 LARGE samples holds 64 KiB or more for every dtype here


def _values(dtype: np.dtype, shape: tuple[int, ...], i: int) -> np.ndarray:
    """Sample i: distinct, deterministic bytes for any dtype."""
    raw = np.arange(i * 7919, i * 7919 + int(np.prod(shape)) * dtype.itemsize, dtype=np.int64)
    data = (raw * 2654435761 % 251).astype(np.uint8)
    array = data.view(dtype).reshape(shape).copy()
    if (
        dtype.kind == "f"
        or dtype.kind == "c"
        or (dtype.names and any(dtype[n].kind == "f" for n in dtype.names))
    ):
        array = (
            np.nan_to_num(array) if dtype.names is None else array
        )  # NaN != NaN: keep comparisons exact
    return array


class Typed:
    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], n: int = 24) -> None:
        self.dtype, self.shape, self.n = dtype, shape, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return _values(self.dtype, self.shape, i)


def _backing(array: np.ndarray) -> str:
    """What the array's memory belongs to: a pool slot, a one-off segment, or the heap."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, ctypes.Array):
        return "slot" if type(base).__name__ == "SlotBuffer" else "one-off"
    return "heap"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if (
        a.dtype.kind in "fc" and a.dtype.itemsize > 8
    ):  # long doubles: their padding bytes are undefined
        return bool(np.array_equal(a, b, equal_nan=True))
    return a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(np.dtype(d)))
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_every_dtype_survives_every_path(dtype, mode) -> None:
    dtype = np.dtype(dtype)
    for shape in (SMALL, LARGE):
        dataset = Typed(dtype, shape)
        expected = list(DataLoader(dataset, batch_size=4, collate_fn=np.stack))
        loader = DataLoader(
            dataset, batch_size=4, collate_fn=np.stack, num_workers=2, worker_mode=mode
        )
        got = list(loader)
        assert len(got) == len(expected) == 6
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert _same(a, b), (
                f"{dtype} {shape} batch {i}: {a.dtype} {a.shape} != {b.dtype} {b.shape}"
            )
        paths = {_backing(b) for b in got}
        if mode == "thread" or shape == SMALL:
            assert paths == {"heap"}, paths
        elif not dtype.hasobject:
            assert paths == {"one-off", "slot"}, f"{dtype}: travelled by {paths}"


COLLATABLE = [d for d in DTYPES if np.dtype(d).kind not in "US" and np.dtype(d) != np.dtype("V4")]


@pytest.mark.parametrize("dtype", COLLATABLE, ids=lambda d: str(np.dtype(d)))
def test_default_collate_writes_every_numeric_dtype_into_its_slot(dtype) -> None:
    """The default collate builds the batch inside the slot itself: the same sweep, that path,
    and the same dtype as the main process builds (native byte order, as np.stack gives)."""
    dtype = np.dtype(dtype)
    dataset = Typed(dtype, LARGE)
    expected = list(DataLoader(dataset, batch_size=4))
    got = list(DataLoader(dataset, batch_size=4, num_workers=2))
    for a, b in zip(got, expected, strict=True):
        assert _same(a, b), f"{dtype}: {a.dtype} != {b.dtype}"
    assert {_backing(b) for b in got} == {"one-off", "slot"}
