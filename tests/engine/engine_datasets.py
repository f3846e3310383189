"""Datasets, worker_init_fns and exceptions used by the engine tests.

They live at module level in a light module (numpy and stoker only) so that spawn and
forkserver workers can unpickle them: a child imports this module by name.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from stoker import IterableDataset, get_worker_info

_WAIT_STEP_S = 0.005
_WAIT_LIMIT_S = 60.0


def wait_for_file(path: str, limit_s: float = _WAIT_LIMIT_S) -> None:
    """Blocks until ``path`` exists (the test's release signal), at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(_WAIT_STEP_S)


def append_line(path: str, text: str) -> None:
    """Appends one line atomically (a single O_APPEND write), from any process or thread."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def worker_id() -> int:
    info = get_worker_info()
    return -1 if info is None else info.id


class Samples:
    """Map-style, no ``__getitems__``: sample ``i`` says who loaded it.

    A sample is ``(i, pid, thread ident, worker id, data)`` where ``data`` is
    ``width`` float64 values all equal to ``i`` (``width=0``: an empty array).
    """

    def __init__(self, n: int, width: int = 0) -> None:
        self.n = n
        self.width = width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        return (
            i,
            os.getpid(),
            threading.get_ident(),
            worker_id(),
            np.full(self.width, i, np.float64),
        )


class BatchedSamples(Samples):
    """Like :class:`Samples` but fetched with ``__getitems__``; each sample says so."""

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        return [(*self[i], "getitems") for i in indices]


class SampleBroken(Exception):
    """A custom exception type that must arrive in the trainer as itself."""


class Raises(Samples):
    """Index ``bad`` raises :class:`SampleBroken` from ``__getitem__``."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if i == self.bad:
            raise SampleBroken(f"sample {i} is broken (raised by worker {worker_id()})")
        return super().__getitem__(i)


class NeedsKeyword(Exception):
    """Pickles but cannot be rebuilt: ``__init__`` requires a keyword argument."""

    def __init__(self, *, detail: str) -> None:
        super().__init__(f"cannot rebuild me: {detail}")


class RaisesUnpicklable(Samples):
    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if i == 1:
            raise NeedsKeyword(detail="sample 1")
        return super().__getitem__(i)


class Exits(Samples):
    """Index ``bad`` ends the worker process with ``os._exit(status)``."""

    def __init__(self, n: int, bad: int, status: int) -> None:
        super().__init__(n)
        self.bad = bad
        self.status = status

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if i == self.bad:
            os._exit(self.status)
        return super().__getitem__(i)


def sleep_forever_in_dataset(release_path: str | None) -> None:
    """The hang: a long sleep, cut short only when the test creates ``release_path``."""
    if release_path is None:
        time.sleep(60)
    else:
        wait_for_file(release_path)


class Hangs(Samples):
    """Index ``bad`` hangs in ``__getitem__`` (see :func:`sleep_forever_in_dataset`)."""

    def __init__(self, n: int, bad: int, release_path: str | None = None) -> None:
        super().__init__(n)
        self.bad = bad
        self.release_path = release_path

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if i == self.bad:
            sleep_forever_in_dataset(self.release_path)
        return super().__getitem__(i)


class BlocksFrom(Samples):
    """Indices ``>= first_blocked`` wait until ``release_path`` exists."""

    def __init__(self, n: int, first_blocked: int, release_path: str, width: int = 0) -> None:
        super().__init__(n, width)
        self.first_blocked = first_blocked
        self.release_path = release_path

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        if i >= self.first_blocked:
            wait_for_file(self.release_path)
        return super().__getitem__(i)


class Recording(Samples):
    """Appends ``i`` to ``log_path`` when the fetch of ``i`` starts.

    Index ``blocked`` (if any) then waits until ``release_path`` exists.
    """

    def __init__(
        self, n: int, log_path: str, blocked: int | None = None, release_path: str = ""
    ) -> None:
        super().__init__(n)
        self.log_path = log_path
        self.blocked = blocked
        self.release_path = release_path

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        append_line(self.log_path, str(i))
        if i == self.blocked:
            wait_for_file(self.release_path)
        return super().__getitem__(i)


class InfoSamples:
    """Sample ``i`` reports the worker's :func:`get_worker_info` as plain values."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = get_worker_info()
        if info is None:
            return {
                "index": i,
                "id": -1,
                "num_workers": -1,
                "seed": -1,
                "own_dataset": False,
            }
        return {
            "index": i,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "own_dataset": info.dataset is self and type(info.dataset) is InfoSamples,
        }


class ReplicaStream(IterableDataset):
    """Yields ``0 .. n-1`` in every worker: no sharding, so each worker repeats it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def shard_bounds(n: int, split: int, worker: int, num_workers: int) -> range:
    """Worker 0 gets ``0 .. split-1``, the others share the rest round-robin."""
    if num_workers == 1:
        return range(n)
    if worker == 0:
        return range(split)
    return range(split + worker - 1, n, num_workers - 1)


class ShardedStream(IterableDataset):
    """An unevenly sharded stream: workers yield different numbers of batches."""

    def __init__(self, n: int, split: int) -> None:
        self.n = n
        self.split = split

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(shard_bounds(self.n, self.split, info.id, info.num_workers))


def record_init(path: str, worker: int) -> None:
    """A worker_init_fn (use with functools.partial) that logs ``worker pid ident``."""
    info = get_worker_info()
    seen = info.id if info is not None else -1
    append_line(path, f"{worker} {seen} {os.getpid()} {threading.get_ident()}")


class InitFailed(Exception):
    pass


def failing_init(worker: int) -> None:
    """A worker_init_fn that fails in worker 1."""
    if worker == 1:
        raise InitFailed(f"worker_init_fn refuses to start worker {worker}")


class Growing(Samples):
    """Batch ``b`` (of ``batch_size`` samples) holds ``width * (b + 1)`` values per sample.

    Later batches outgrow the slot sized after the first ones.
    """

    def __init__(self, n: int, batch_size: int, width: int) -> None:
        super().__init__(n, width)
        self.batch_size = batch_size

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        index, pid, ident, worker, _ = super().__getitem__(i)
        return (
            index,
            pid,
            ident,
            worker,
            np.full(self.width * (i // self.batch_size + 1), i, np.float64),
        )


def _torch_iterable_base() -> type:
    try:
        import torch.utils.data
    except ImportError:
        return IterableDataset
    return torch.utils.data.IterableDataset


class TorchShardedStream(_torch_iterable_base()):  # type: ignore[misc]
    """A torch IterableDataset that shards itself with torch.utils.data.get_worker_info()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class BigAnswers:
    """Map-style with ``__getitems__``: sample ``i`` is ``(i, text of `size` characters)``.

    The text collates to a list, which travels inside the pickle, so a batch's answer is
    larger than a pipe holds. Every fetched batch is logged as one line of ``log``.
    """

    def __init__(self, n: int, log: str, size: int = 256 * 1024) -> None:
        self.n, self.log, self.size = n, log, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, str]:
        return i, "x" * self.size

    def __getitems__(self, indices: list[int]) -> list[tuple[int, str]]:
        append_line(self.log, " ".join(map(str, indices)))
        return [self[i] for i in indices]


class Tensors:
    """Sample ``i`` is a float32 tensor of ``width`` values all equal to ``i``."""

    def __init__(self, n: int, width: int) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.full((self.width,), float(i))


class LogBatches:
    """A ``datasets`` formatting transform that logs each batch it formats to ``log``."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, batch: dict) -> dict:
        append_line(self.log, " ".join(map(str, batch["idx"])))
        return batch
