"""Datasets, worker_init_fns and exceptions used by the engine tests.

They live at module level in a light module (numpy and stoker only) so that spawn and
forkserver workers can unpickle them: a child imports this module by name.
"""

from __future__ import annotations

import math
import os
import random
import sys
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


def use_up_file_descriptors(worker: int) -> None:
    """worker_init_fn: lowers the open-file limit to what the worker has open, so it cannot
    open or map anything more (a worker that ran out of file descriptors)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))


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


# ------------------------------------------------------------------ worker seeds


def _torch_initial_seed() -> int:
    """``torch.initial_seed()`` when torch is loaded in this process, else -1."""
    torch = sys.modules.get("torch")
    return int(torch.initial_seed()) if torch is not None else -1


def log_seed_at_init(path: str, worker: int) -> None:
    """A worker_init_fn (use with functools.partial) that logs what it sees of its seed.

    One line: ``worker info.seed torch.initial_seed() info.worker_method rng-kind``.
    """
    info = get_worker_info()
    rng = "none" if info.rng is None else type(info.rng).__name__
    append_line(path, f"{worker} {info.seed} {_torch_initial_seed()} {info.worker_method} {rng}")


class WorkerSeeds:
    """Sample ``i``: ``(i, worker id, get_worker_info().seed, torch.initial_seed() or -1)``.

    The torch seed is reduced modulo 2**63 to fit int64 (a thread worker sees the
    trainer's, which may be any 64-bit value); a process worker's seed is smaller.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int]:
        info = get_worker_info()
        return (i, info.id, info.seed, _torch_initial_seed() % 2**63)


def seed_globals_in_init(seed: int, which: str, worker: int) -> None:
    """A worker_init_fn (functools.partial) that seeds the global generators named in ``which``.

    ``which`` is a comma-separated subset of ``numpy,python,torch``; every worker gets the
    same seed, as a user who copies a seeding line into worker_init_fn does.
    """
    names = which.split(",")
    if "numpy" in names:
        np.random.seed(seed)
    if "python" in names:
        random.seed(seed)
    if "torch" in names:
        import torch

        torch.manual_seed(seed)


def configure_in_init(worker: int) -> None:
    """A worker_init_fn that configures the worker without touching any generator."""
    get_worker_info().dataset.configured_by = worker


class GlobalDraws:
    """Sample ``i``: ``(i, worker id, numpy draw, python draw, torch draw or -1)``.

    Each draw comes from the module-level generator, as most augmentation code draws.
    """

    def __init__(self, n: int, use_torch: bool = False) -> None:
        self.n = n
        self.use_torch = use_torch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int]:
        torch_draw = -1
        if self.use_torch:
            import torch

            torch_draw = int(torch.randint(0, 2**30, ()).item())
        return (
            i,
            worker_id(),
            int(np.random.randint(0, 2**30)),
            random.getrandbits(30),
            torch_draw,
        )


class SharedCounter:
    """Counts its fetches in a ``multiprocessing`` Value guarded by a Lock and a Semaphore.

    Built from a multiprocessing context, as torch users share state with workers: the
    primitives reach spawn and forkserver workers only when the worker process is started
    with them.
    """

    def __init__(self, n: int, context: Any) -> None:
        self.n = n
        self.count = context.Value("i", 0)  # shared memory, with its own RLock
        self.lock = context.Lock()
        self.gate = context.Semaphore(2)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.gate, self.lock, self.count.get_lock():
            self.count.value += 1
        return i


def block_worker_zero_stream(release_path: str, n_per_worker: int):
    """Worker 0 yields its first item only once ``release_path`` exists; the others at once."""
    info = get_worker_info()
    first = info.id * n_per_worker
    for i in range(first, first + n_per_worker):
        if info.id == 0 and i == first:
            wait_for_file(release_path)
        yield i


class StallingStream(IterableDataset):
    """Each worker yields ``n_per_worker`` items of its own; worker 0 stalls at its first."""

    def __init__(self, n_per_worker: int, release_path: str) -> None:
        self.n_per_worker = n_per_worker
        self.release_path = release_path

    def __iter__(self):
        return block_worker_zero_stream(self.release_path, self.n_per_worker)


class RangeStream(IterableDataset):
    """Yields ``start .. end-1``; :func:`split_range_in_init` narrows it to a worker's share."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_range_in_init(worker: int) -> None:
    """torch's documented way to shard an IterableDataset: in worker_init_fn, once."""
    info = get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = math.ceil((overall_end - overall_start) / info.num_workers)
    dataset.start = overall_start + worker * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


class WorkersMeet(SharedCounter):
    """Each fetch waits until every worker has started one: a barrier across workers.

    It completes only if each of the first ``num_workers`` samples goes to a different
    worker (torch's round-robin does that); a worker given two of them waits forever.
    """

    def __init__(self, num_workers: int, context: Any, limit_s: float = 30.0) -> None:
        super().__init__(num_workers, context)
        self.arrived = context.Semaphore(0)
        self.limit_s = limit_s

    def __getitem__(self, i: int) -> int:
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.n:
                self.arrived.release()
        if not self.arrived.acquire(timeout=self.limit_s):
            raise TimeoutError(
                f"sample {i}: the other workers never arrived (one worker holds two samples)"
            )
        self.arrived.release()
        return worker_id()


# ------------------------------------------------------------------ failures outside the fetch


class Unpicklable:
    """A collate result that pickle refuses (it holds a lock)."""

    def __init__(self, indices: list[int]) -> None:
        self.indices = indices
        self.lock = threading.Lock()


def collate_unpicklable_at(bad: int):
    """A collate_fn (module-level, for spawn) whose batch holding ``bad`` cannot travel."""
    return _CollateUnpicklable(bad)


class _CollateUnpicklable:
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, samples: list) -> object:
        indices = [s[0] for s in samples]
        return Unpicklable(indices) if self.bad in indices else indices


class BreaksWhenUnpickled(Samples):
    """Pickles fine, fails to unpickle: a spawned worker cannot even start."""

    def __reduce__(self):
        return (_refuse_to_unpickle, (self.n,))


class NeedsAModuleItCannotFind(Exception):
    pass


def _refuse_to_unpickle(n: int) -> Samples:
    raise NeedsAModuleItCannotFind(f"this dataset of {n} samples cannot be rebuilt in a worker")


class MappedPages:
    """Sample i is the first byte of page i of a file mapped (lazily, per worker) with mmap."""

    def __init__(self, path: str, pages: int) -> None:
        self.path, self.pages, self._map = path, pages, None

    def __len__(self) -> int:
        return self.pages

    def __getitem__(self, i: int) -> int:
        if self._map is None:
            import mmap

            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map[i * 4096]


class CollectsGarbage:
    """Runs the garbage collector in the worker before each sample, and logs to ``log`` every
    exception a finalizer raised during it (test runners swallow those in children)."""

    def __init__(self, n: int, log: str) -> None:
        self.n, self.log = n, log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        import gc
        import sys

        sys.unraisablehook = lambda u: append_line(
            self.log, f"{type(u.exc_value).__name__}: {u.exc_value}"
        )
        gc.collect()
        return i


class NestedLoader:
    """Each sample loads a little dataset of its own through a DataLoader with process workers."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        from stoker import DataLoader

        return sum(int(b.sum()) for b in DataLoader(list(range(4)), batch_size=2, num_workers=1))


class ThreadSafeDraws:
    """Declares ``thread_safe = True``; sample ``i``: ``(i, pid, global numpy draw, data)``.

    The draw comes from numpy's module-level generator, which stoker serves per sample,
    so the draws do not depend on which worker, thread or process loaded the sample.
    ``spin_s``: seconds of pure Python per sample (holds the GIL all along).
    """

    thread_safe = True

    def __init__(self, n: int, width: int = 3, spin_s: float = 0.0) -> None:
        self.n = n
        self.width = width
        self.spin_s = spin_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        if self.spin_s:
            deadline = time.perf_counter() + self.spin_s
            while time.perf_counter() < deadline:
                pass
        return i, os.getpid(), int(np.random.randint(0, 2**30)), np.full(self.width, i, np.float32)
