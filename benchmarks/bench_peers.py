"""stoker.DataLoader against its peers, side by side, on the same datasets, in one run.

Run from the repository root in the peers' own environment (see ``benchmarks/peers_env.sh``,
which builds it and runs this script)::

    benchmarks/peers_env.sh                                     # every loader, every workload
    benchmarks/peers_env.sh --workloads jpeg --rounds 7 --json out.json
    PYTHONPATH=src .venv/bin/python benchmarks/bench_peers.py --quick \\
        --loaders torch,stoker-process,stoker-thread           # stoker's own environment

A loader whose library is not installed is reported as unavailable, with the reason, and
the run goes on without it.

Loaders (all with 2 workers and shuffling; each library at its usual fastest settings):

- ``torch``: ``torch.utils.data.DataLoader(num_workers=2, persistent_workers=True)``
- ``torchdata-sdl``: ``torchdata.stateful_dataloader.StatefulDataLoader``, same arguments
- ``torchdata-nodes-process`` / ``-thread``: ``torchdata.nodes`` as its migration guide
  builds a DataLoader: ``SamplerWrapper`` -> ``Batcher`` -> ``ParallelMapper`` (fetch and
  collate a whole batch, 2 workers, ``method="process"`` or ``"thread"``) -> ``Prefetcher``
  -> ``Loader``
- ``grain``: Grain's dataset API, ``grain.MapDataset.source(ds).shuffle(seed=0)
  .batch(B).to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=2))``
  with one reading thread and 2 batches read ahead per worker (batches come back through
  shared memory); ``grain-dataloader`` (only when asked for):
  ``grain.DataLoader`` with an ``IndexSampler``, ``grain.transforms.Batch`` and
  ``worker_count=2``, which runs each record through its own pipeline
- ``spdl-process``: ``spdl.pipeline.PipelineBuilder`` over a batch sampler, fetch + collate
  of a batch in a 2-process ``ProcessPoolExecutor`` (what ``spdl.dataloader`` builds)
- ``spdl-thread``: the same pipeline with the batches made in 2 threads
- ``stoker-process``, ``stoker-thread``, ``stoker-auto``: ``stoker.DataLoader`` with
  ``num_workers=2, persistent_workers=True`` and that ``worker_mode`` (``"auto"``, the
  default, is the reference of the ratios; a stoker without it shows that row as unavailable
  and the ratios are to ``"process"``)

Every loader gets the SAME dataset object, so the per-sample work is the same and only the
loader differs. The workloads are those of ``bench_engine.py`` (``bench_workloads.py``),
with two changes so that every batch names its samples: the large arrays come with their
index, and the JPEG samples are decoded and augmented with ``stoker.vision``
(``decode_image`` + ``train_transform(224)``: random resized crop, flip, normalise, CHW).
torch and torchdata collate with torch's ``default_collate`` (tensors); Grain with its own
``Batch`` (numpy); SPDL and stoker with numpy (``np.stack`` per field, stoker's default).

Method: a round runs one epoch of every loader, the order rotated by one loader each round.
The dataset holds exactly ``warmup + timed`` batches; the clock starts when the warm-up
batches have arrived and stops at the last batch. The loop copies each batch's indices
out (a few microseconds, the same for every loader) and drops the batch. After every epoch
the indices are counted: every sample must have arrived exactly once, or the run stops with
an error. Figures are medians over the rounds; a peer's ratio to stoker is the ratio of
medians, with the lowest and highest per-round ratio beside it. Time to first batch builds a
fresh loader (construction + worker start + first batch), median over the rounds, again in
rotated order. For the large arrays the machine's copy bandwidth is measured (``np.copyto``
of 24 MiB, and the batch's own ``np.stack`` into a reused buffer; one thread, and one per
CPU at once) and each loader is shown as a share of the copy-bound limit, the best of those
rates: a batch needs at least one copy of its bytes (the collation). A reused 24 MiB buffer
stays in the CPU's last-level cache, which a loader's batches do not: it keeps several in
flight. So the ``np.stack`` is also timed into buffers taken in turn, as many as 2 workers
with 2 batches each in flight and 2 held by the loop use (6 x 24 MiB), and each loader is
shown as a share of that memory-bound limit too.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import datetime
import gc
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_workloads  # found through the sys.path entry just above
from bench_engine import wait_for_idle

WORKERS = 2
IN_FLIGHT = WORKERS * 2 + 2  # batches a loader's 2 workers load ahead (2 each) and the loop holds
# Ratios are to stoker's default configuration: worker_mode="auto" where stoker offers it.
REFERENCES = ("stoker-auto", "stoker-process")
# grain-dataloader runs only when asked for: on tiny samples it is ~25x slower than Grain's
# dataset API (each record passes its own Python pipeline), and an epoch takes ~40 s.
OPTIONAL_LOADERS = ("grain-dataloader",)
LOADERS = (
    "torch",
    "torchdata-sdl",
    "torchdata-nodes-process",
    "torchdata-nodes-thread",
    "grain",
    "spdl-process",
    "spdl-thread",
    "stoker-process",
    "stoker-thread",
    "stoker-auto",
)


# ----------------------------------------------------------------------------- workloads


class IndexedLargeArrays(bench_workloads.LargeArrayDataset):
    """``LargeArrayDataset`` whose sample ``i`` is ``(array, i)``, so batches name their samples.

    Example:
        >>> array, index = IndexedLargeArrays(8, shape=(3, 4, 4))[5]
        >>> array.shape, index
        ((3, 4, 4), 5)
    """

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:  # type: ignore[override]
        return self.pool[index % len(self.pool)], index


class VisionJpegDataset:
    """Sample ``i``: file ``i % len(paths)`` read, decoded and augmented with ``stoker.vision``.

    ``decode_image`` (libjpeg-turbo through simplejpeg when installed, else Pillow), then
    ``train_transform(crop)``: random resized crop, random flip, ImageNet normalisation,
    HWC -> CHW float32. Its random draws come from ``stoker.sample_rng``, which outside a
    stoker loader is seeded from numpy's global generator.
    """

    thread_safe = True  # a file per read and stoker.vision's transforms: threads may share it

    def __init__(self, paths: list[str], length: int, crop: int = 224) -> None:
        from stoker.vision import train_transform

        self.paths = list(paths)
        self.length = length
        self.transform = train_transform(crop)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from stoker.vision import decode_image

        with open(self.paths[index % len(self.paths)], "rb") as f:
            data = f.read()
        return self.transform(decode_image(data)), index


_JPEG_FOLDER: dict[str, Any] = {}  # written once per run, removed at exit


def _jpeg_dataset(length: int, files: int) -> VisionJpegDataset:
    folder = _JPEG_FOLDER.get("folder")
    if folder is None:
        folder = _JPEG_FOLDER["folder"] = bench_workloads.write_jpeg_folder(files)
        atexit.register(folder.remove)
    return VisionJpegDataset(folder.paths, length)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    batch_size: int
    warmup: int
    timed: int
    quick_timed: int
    index_field: int  # which field of a batch holds the sample indices
    make: Callable[[int, bool], Any]  # (number of samples, quick) -> dataset


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "tiny",
            "(i, float(i)) Python numbers, batch 256",
            256,
            10,
            1500,
            60,
            0,
            lambda n, quick: bench_workloads.TinyDataset(n),
        ),
        Workload(
            "large",
            "(3x256x256 float32 array, i), batch 32 (24 MiB per batch)",
            32,
            6,
            200,
            12,
            1,
            lambda n, quick: IndexedLargeArrays(n),
        ),
        Workload(
            "cpu",
            "~1.6 ms/sample numpy FFT filtering on 3x64x64, batch 32",
            32,
            6,
            30,
            4,
            1,
            lambda n, quick: bench_workloads.CpuTransformDataset(n, steps=2 if quick else 10),
        ),
        Workload(
            "jpeg",
            "256x256 JPEG: stoker.vision decode + train_transform(224), batch 64",
            64,
            5,
            30,
            3,
            1,
            lambda n, quick: _jpeg_dataset(n, 32 if quick else 512),
        ),
    )
}


# ----------------------------------------------------------------------------- loaders


class Unavailable(Exception):
    """A loader that cannot run here (library not installed, mode not offered)."""


def numpy_collate(samples: list[Any]) -> Any:
    """Stacks a list of samples field by field into numpy arrays (tuples stay tuples)."""
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(numpy_collate([s[k] for s in samples]) for k in range(len(first)))
    if isinstance(first, np.ndarray):
        return np.stack(samples)
    return np.asarray(samples)


class _FetchAndCollate:
    """``indices -> collate([dataset[i] for i in indices])``: a whole batch in one call."""

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate = collate

    def __call__(self, indices: list[int]) -> Any:
        return self.collate([self.dataset[i] for i in indices])


_WORKER_FETCH: list[_FetchAndCollate] = []  # set in each process-pool worker


def _init_pool_worker(fetch: _FetchAndCollate) -> None:
    _WORKER_FETCH[:] = [fetch]


def _fetch_in_pool_worker(indices: list[int]) -> Any:
    return _WORKER_FETCH[0](indices)


class Loader:
    """One library's loader over one dataset: ``epoch()`` iterates one epoch's batches."""

    def __init__(self, name: str, dataset: Any, batch_size: int) -> None:
        self.name = name
        self.dataset = dataset
        self.batch_size = batch_size
        self.batches = -(-len(dataset) // batch_size)
        self._closers: list[Callable[[], None]] = []
        self._epoch: Callable[[], Iterator[Any]] = self._build()

    def epoch(self) -> Iterator[Any]:
        return self._epoch()

    def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:  # closing is best effort: the figures are taken
                traceback.print_exc()
        self._closers.clear()

    # -- one builder per library

    def _build(self) -> Callable[[], Iterator[Any]]:
        library = self.name.split("-")[0]
        try:
            build = getattr(self, f"_build_{library}")
            return build()
        except ImportError as error:
            msg = f"{error.name or error} is not installed here"
            raise Unavailable(msg) from error

    def _build_torch(self) -> Callable[[], Iterator[Any]]:
        import torch.utils.data

        return self._torch_style(torch.utils.data.DataLoader)

    def _torch_style(self, loader_class: type) -> Callable[[], Iterator[Any]]:
        """torch's DataLoader or a subclass (StatefulDataLoader), 2 persistent workers."""
        loader = loader_class(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
        )
        self._closers.append(lambda: _stop_torch_workers(loader))
        return lambda: iter(loader)

    def _build_torchdata(self) -> Callable[[], Iterator[Any]]:
        if self.name == "torchdata-sdl":
            from torchdata.stateful_dataloader import StatefulDataLoader

            return self._torch_style(StatefulDataLoader)
        import torchdata.nodes as tn
        from torch.utils.data import RandomSampler, default_collate

        method = self.name.rsplit("-", 1)[1]
        node: Any = tn.SamplerWrapper(RandomSampler(self.dataset))
        node = tn.Batcher(node, batch_size=self.batch_size, drop_last=False)
        node = tn.ParallelMapper(
            node,
            map_fn=_FetchAndCollate(self.dataset, default_collate),
            num_workers=WORKERS,
            method=method,
            in_order=True,
        )
        node = tn.Prefetcher(node, prefetch_factor=2 * WORKERS)
        loader = tn.Loader(node)
        self._closers.append(lambda: _stop_node(node))
        return lambda: iter(loader)

    def _build_grain(self) -> Callable[[], Iterator[Any]]:
        import grain

        if self.name == "grain-dataloader":
            sampler = grain.samplers.IndexSampler(
                num_records=len(self.dataset),
                shard_options=grain.sharding.NoSharding(),
                shuffle=True,
                num_epochs=1,
                seed=0,
            )
            loader = grain.DataLoader(
                data_source=self.dataset,
                sampler=sampler,
                operations=[grain.transforms.Batch(self.batch_size)],
                worker_count=WORKERS,
                worker_buffer_size=2,
            )
            return lambda: iter(loader)
        batches = grain.MapDataset.source(self.dataset).shuffle(seed=0).batch(self.batch_size)
        # One reading thread and 2 batches read ahead per worker, as a torch or stoker worker:
        # the defaults (16 threads, 500 elements ahead) oversubscribe 2 CPUs and, on short
        # epochs, would hand over batches made before the clock starts.
        reading = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
        options = grain.MultiprocessingOptions(num_workers=WORKERS)
        return lambda: iter(batches.to_iter_dataset(reading).mp_prefetch(options))

    def _build_spdl(self) -> Callable[[], Iterator[Any]]:
        from spdl.pipeline import PipelineBuilder
        from torch.utils.data import BatchSampler, RandomSampler

        batch_sampler = BatchSampler(RandomSampler(self.dataset), self.batch_size, False)
        fetch = _FetchAndCollate(self.dataset, numpy_collate)
        if self.name == "spdl-process":
            executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=WORKERS,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_init_pool_worker,
                initargs=(fetch,),
            )
            self._closers.append(lambda: executor.shutdown(cancel_futures=True))
            stage: dict[str, Any] = {"op": _fetch_in_pool_worker, "executor": executor}
            threads = 1
        else:
            stage = {"op": fetch}
            threads = WORKERS

        def epoch() -> Iterator[Any]:
            pipeline = (
                PipelineBuilder()
                .add_source(batch_sampler)
                .pipe(stage["op"], executor=stage.get("executor"), concurrency=WORKERS)
                .add_sink(2 * WORKERS)
                .build(num_threads=threads)
            )
            with pipeline.auto_stop():
                yield from pipeline.get_iterator()

        return epoch

    def _build_stoker(self) -> Callable[[], Iterator[Any]]:
        import stoker

        mode = self.name.split("-", 1)[1]
        try:
            loader = stoker.DataLoader(
                self.dataset,
                batch_size=self.batch_size,
                shuffle=True,
                num_workers=WORKERS,
                persistent_workers=True,
                worker_mode=mode,
            )
        except ValueError as error:
            msg = f"stoker.DataLoader does not take worker_mode={mode!r} ({error})"
            raise Unavailable(msg) from error
        self._closers.append(loader.close)
        self.stoker_loader = loader
        return lambda: iter(loader)


def _stop_torch_workers(loader: Any) -> None:
    """Stops a torch loader's persistent workers (torch has no public way; this is its own)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def _quiet_torchdata_threads(args: Any) -> None:
    """Drops what torchdata's sorting thread raises when its workers stop under it; else default.

    Stopping ``torchdata.nodes`` workers with batches in flight leaves that thread reading a
    tensor whose file descriptor went away with its worker: noise, not a result.
    """
    if "_sort_worker" in getattr(args.thread, "name", "") and issubclass(args.exc_type, OSError):
        return
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)


def _stop_node(node: Any) -> None:
    """Stops a torchdata node's worker pool (its own shutdown, reached through the Prefetcher)."""
    threading.excepthook = _quiet_torchdata_threads
    while node is not None:
        for attr in ("_it", "source"):
            inner = getattr(node, attr, None)
            if inner is not None and hasattr(inner, "_shutdown"):
                inner._shutdown()
        node = getattr(node, "source", None)


# ----------------------------------------------------------------------------- measuring


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(slots=True)
class Usage:
    """CPU seconds in user and kernel mode, and minor page faults, of some processes."""

    user_s: float = 0.0
    sys_s: float = 0.0
    faults: int = 0

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.user_s - other.user_s, self.sys_s - other.sys_s, self.faults - other.faults
        )


def _usage(pids: list[int]) -> Usage | None:
    """The summed :class:`Usage` of ``pids`` (all their threads), None without /proc."""
    total = Usage()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            if pid == os.getpid():
                return None
            continue  # a worker that exited
        # after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt
        # cmajflt utime stime ...
        total.faults += int(fields[7])
        total.user_s += int(fields[11]) / _TICKS
        total.sys_s += int(fields[12]) / _TICKS
    return total


def _worker_pids() -> list[int]:
    from stoker._proc import descendants

    return descendants(os.getpid(), helpers=True)


def _machine_busy_s() -> float | None:
    from stoker._proc import machine_busy_s

    return machine_busy_s()


@dataclass(slots=True)
class Epoch:
    rate: float  # timed batches per second
    main: Usage | None  # this process (trainer and its threads), per timed batch
    workers: Usage | None  # worker processes, per timed batch
    foreign_cores: float | None  # CPUs other processes kept busy during the timed batches


class NotExactlyOnce(AssertionError):
    """A loader delivered some sample twice, or not at all, in one epoch."""


def check_exactly_once(name: str, indices: list[np.ndarray], length: int) -> None:
    """Raises :class:`NotExactlyOnce` unless ``indices`` hold each of ``0..length-1`` once."""
    seen = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    counts = np.bincount(seen, minlength=length) if seen.size else np.zeros(length, np.int64)
    missing, repeated = int((counts == 0).sum()), int((counts > 1).sum())
    extra = int(counts.size - length)
    if missing or repeated or extra:
        msg = (
            f"{name} did not deliver every sample exactly once in an epoch: {missing} missing, "
            f"{repeated} delivered more than once, {extra} out of range (of {length})"
        )
        raise NotExactlyOnce(msg)


def _indices(batch: Any, field_: int) -> np.ndarray:
    """A copy of the batch's sample indices (so that the batch itself can be dropped)."""
    return np.array(np.asarray(batch[field_]), dtype=np.int64)


def time_epoch(loader: Loader, workload: Workload, timed: int) -> Epoch:
    gc.collect()
    field_ = workload.index_field
    indices: list[np.ndarray] = []
    iterator = loader.epoch()
    for _ in range(workload.warmup):
        indices.append(_indices(next(iterator), field_))
    pids = _worker_pids()
    main0, workers0, busy0 = _usage([os.getpid()]), _usage(pids), _machine_busy_s()
    start = time.perf_counter()
    for _ in range(timed):
        indices.append(_indices(next(iterator), field_))  # a copy: drop batch
    elapsed = time.perf_counter() - start
    main1, workers1, busy1 = _usage([os.getpid()]), _usage(pids), _machine_busy_s()
    for batch in iterator:  # the epoch must end here
        indices.append(_indices(batch, field_))
    check_exactly_once(loader.name, indices, len(loader.dataset))
    main = workers = foreign = None
    if main0 is not None and main1 is not None and workers0 is not None and workers1 is not None:
        main, workers = main1 - main0, workers1 - workers0
        if busy0 is not None and busy1 is not None:
            used = main.user_s + main.sys_s + workers.user_s + workers.sys_s
            foreign = max(0.0, (busy1 - busy0) - used) / elapsed
        main, workers = _per_batch(main, timed), _per_batch(workers, timed)
    return Epoch(timed / elapsed, main, workers, foreign)


def _per_batch(usage: Usage, batches: int) -> Usage:
    return Usage(usage.user_s / batches, usage.sys_s / batches, usage.faults // batches)


def time_first_batch(name: str, dataset: Any, batch_size: int, field_: int) -> float:
    """Seconds from building a fresh loader to holding its first batch (workers included)."""
    gc.collect()
    start = time.perf_counter()
    loader = Loader(name, dataset, batch_size)
    iterator = loader.epoch()
    batch = next(iterator)
    elapsed = time.perf_counter() - start
    _indices(batch, field_)
    del batch
    if hasattr(iterator, "close"):
        iterator.close()
    del iterator
    loader.close()
    return elapsed


@dataclass(slots=True)
class CopyBandwidth:
    """Bytes per second of two 24 MiB copies, on one thread and on one thread per CPU at once.

    ``copyto``: ``np.copyto`` between two 24 MiB buffers. ``stack``: the large workload's
    collation alone, ``np.stack`` of its 32 arrays (from the dataset's pool of 4, so the
    sources stay in cache) into a buffer that is reused, as a batch slot is. ``turns``: the
    same ``np.stack`` into ``IN_FLIGHT`` buffers in all, taken in turn (a loader's slots),
    which do not fit in the caches.
    """

    nbytes: int
    threads: int
    copyto_one: float
    copyto_all: float
    stack_one: float
    stack_all: float
    turns_one: float
    turns_all: float

    @property
    def best(self) -> float:
        """The in-cache limit: the best of the copies into one reused buffer."""
        return max(self.copyto_one, self.copyto_all, self.stack_one, self.stack_all)

    @property
    def memory_bound(self) -> float:
        """The limit with a loader's batches in flight: collations into buffers in turn."""
        return max(self.turns_one, self.turns_all)


def _copy_rate(copies: list[Callable[[], None]], nbytes: int, repeats: int) -> float:
    """Bytes per second of running every callable of ``copies`` at once (one thread each)."""
    for copy in copies:
        copy()  # first touch outside the clock
    if len(copies) == 1:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            copies[0]()
            times.append(time.perf_counter() - start)
        return nbytes / statistics.median(times)
    # Each thread times its own copies (the coordinating thread may not even be on a CPU
    # while they run); a round lasts from the first start to the last end.
    barrier = threading.Barrier(len(copies))
    spans: list[list[tuple[float, float]]] = [[] for _ in copies]

    def run(k: int) -> None:
        for _ in range(repeats):
            barrier.wait()
            start = time.perf_counter()
            copies[k]()
            spans[k].append((start, time.perf_counter()))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(copies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = [
        max(end for _, end in rounds) - min(start for start, _ in rounds)
        for rounds in zip(*spans, strict=True)
    ]
    return len(copies) * nbytes / statistics.median(times)


def measure_copy_bandwidth(dataset: IndexedLargeArrays, batch: int, repeats: int) -> CopyBandwidth:
    """Median over ``repeats`` copies of each kind (see :class:`CopyBandwidth`)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    samples = [dataset.pool[i % len(dataset.pool)] for i in range(batch)]
    nbytes = sum(a.nbytes for a in samples)

    def copyto() -> Callable[[], None]:
        src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        return lambda: np.copyto(dst, src)

    def stack() -> Callable[[], None]:
        out = np.empty((batch, *samples[0].shape), samples[0].dtype)
        return lambda: np.stack(samples, out=out)

    def turns(buffers: int) -> Callable[[], None]:
        outs = [np.zeros((batch, *samples[0].shape), samples[0].dtype) for _ in range(buffers)]
        turn = itertools.count()
        return lambda: np.stack(samples, out=outs[next(turn) % buffers])

    return CopyBandwidth(
        nbytes,
        cpus,
        _copy_rate([copyto()], nbytes, repeats),
        _copy_rate([copyto() for _ in range(cpus)], nbytes, repeats),
        _copy_rate([stack()], nbytes, repeats),
        _copy_rate([stack() for _ in range(cpus)], nbytes, repeats),
        _copy_rate([turns(IN_FLIGHT)], nbytes, repeats),
        _copy_rate([turns(max(1, IN_FLIGHT // cpus)) for _ in range(cpus)], nbytes, repeats),
    )


# ----------------------------------------------------------------------------- running


@dataclass(slots=True)
class WorkloadResult:
    name: str
    description: str
    batch_size: int
    samples: int
    timed: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    main_usage: dict[str, list[Usage]] = field(default_factory=dict)
    worker_usage: dict[str, list[Usage]] = field(default_factory=dict)
    ttfb_s: dict[str, list[float]] = field(default_factory=dict)
    foreign_cores: list[float] = field(default_factory=list)
    checked_epochs: dict[str, int] = field(default_factory=dict)
    batch_bytes: int = 0
    waited_s: float = 0.0  # spent waiting for other processes to leave the CPUs idle
    bandwidth: CopyBandwidth | None = None  # large arrays only

    def median(self, loader: str) -> float:
        return statistics.median(self.rates[loader])

    def ratio(self, loader: str, reference: str) -> tuple[float, float, float]:
        """(ratio of medians, lowest and highest per-round ratio) of ``loader`` to ``reference``."""
        rounds = [a / b for a, b in zip(self.rates[loader], self.rates[reference], strict=True)]
        return self.median(loader) / self.median(reference), min(rounds), max(rounds)


def rotated(names: list[str], round_: int) -> list[str]:
    """The loaders in the order of round ``round_``: shifted left by one per round."""
    k = round_ % len(names) if names else 0
    return names[k:] + names[:k]


def run_workload(
    workload: Workload,
    names: list[str],
    rounds: int,
    quick: bool,
    unavailable: dict[str, str],
    ttfb_rounds: int,
    wait_idle_s: float = 0.0,
) -> WorkloadResult:
    timed = workload.quick_timed if quick else workload.timed
    samples = (workload.warmup + timed) * workload.batch_size
    dataset = workload.make(samples, quick)
    result = WorkloadResult(
        workload.name, workload.description, workload.batch_size, samples, timed
    )
    if workload.name == "large":
        result.batch_bytes = workload.batch_size * dataset.pool[0].nbytes
        result.bandwidth = measure_copy_bandwidth(
            dataset, workload.batch_size, repeats=9 if quick else 41
        )
    loaders: dict[str, Loader] = {}
    for name in names:
        if name in unavailable:
            continue
        try:
            loaders[name] = Loader(name, dataset, workload.batch_size)
        except Unavailable as why:
            unavailable[name] = str(why)
            _progress(f"  {name}: unavailable ({why})")
    present = [n for n in names if n in loaders]
    try:
        for round_ in range(rounds):
            result.waited_s += wait_for_idle(wait_idle_s)
            for name in rotated(present, round_):
                epoch = time_epoch(loaders[name], workload, timed)
                result.rates.setdefault(name, []).append(epoch.rate)
                if epoch.main is not None and epoch.workers is not None:
                    result.main_usage.setdefault(name, []).append(epoch.main)
                    result.worker_usage.setdefault(name, []).append(epoch.workers)
                if epoch.foreign_cores is not None:
                    result.foreign_cores.append(epoch.foreign_cores)
                result.checked_epochs[name] = result.checked_epochs.get(name, 0) + 1
            _progress(
                f"  {workload.name} round {round_ + 1}/{rounds}: "
                + "  ".join(f"{n} {result.rates[n][-1]:.1f}" for n in present)
            )
    finally:
        for loader in loaders.values():
            loader.close()
    for round_ in range(ttfb_rounds):
        result.waited_s += wait_for_idle(wait_idle_s)
        for name in rotated(present, round_):
            first = time_first_batch(name, dataset, workload.batch_size, workload.index_field)
            result.ttfb_s.setdefault(name, []).append(first)
    _progress(f"  {workload.name}: time to first batch done")
    return result


# ----------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    versions = {}
    for module in ("numpy", "torch", "torchdata", "grain", "spdl", "PIL", "simplejpeg", "stoker"):
        try:
            mod = __import__(module)
        except ImportError:
            versions[module] = None
            continue
        versions[module] = getattr(mod, "__version__", None) or _dist_version(module)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "start_method": multiprocessing.get_start_method(),
        "git_commit": commit or None,
        "load_average": f"{os.getloadavg()[0]:.2f}",
        "versions": versions,
    }


def _dist_version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _median_usage(usages: list[Usage]) -> Usage:
    return Usage(
        statistics.median(u.user_s for u in usages),
        statistics.median(u.sys_s for u in usages),
        int(statistics.median(u.faults for u in usages)),
    )


def _cpu_cell(result: WorkloadResult, name: str) -> str:
    main = statistics.median(u.user_s + u.sys_s for u in result.main_usage[name]) * 1e3
    workers = statistics.median(u.user_s + u.sys_s for u in result.worker_usage[name]) * 1e3
    return f"{main:.2f} / {workers:.2f}"


def _usage_cells(result: WorkloadResult, name: str) -> list[str]:
    cells = []
    for usage in (result.main_usage[name], result.worker_usage[name]):
        u = _median_usage(usage)
        cells += [f"{u.user_s * 1e3:.2f}", f"{u.sys_s * 1e3:.2f}", f"{u.faults}"]
    return cells


def render(
    results: dict[str, WorkloadResult],
    names: list[str],
    unavailable: dict[str, str],
    env: dict[str, Any],
    command: str,
) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [
        f"command: {command}",
        f"machine: {env['cpus']} CPUs, Python {env['python']}, start method "
        f"{env['start_method']}; {versions}; git {env['git_commit']}; {env['date']}; "
        f"1-min load average {env['load_average']} at start, {env['load_average_end']} at end",
        "",
    ]
    waited = sum(r.waited_s for r in results.values())
    if waited:
        lines[-1:-1] = [f"waited {waited:.0f} s in all for other processes to leave the CPUs idle"]
    shown = [n for n in names if any(n in r.rates for r in results.values())]
    reference = next(
        (ref for ref in REFERENCES if all(ref in r.rates for r in results.values())), None
    )
    lines += ["Throughput, median batches/s", ""]
    rows = [
        [n, *(f"{r.median(n):.1f}" if n in r.rates else "-" for r in results.values())]
        for n in shown
    ]
    lines += _table(["loader", *results], rows)
    if reference is not None:
        lines += ["", f"Throughput as a multiple of {reference} (per-round range)", ""]
        rows = [
            [
                n,
                *(
                    "{:.2f}x [{:.2f}-{:.2f}]".format(*r.ratio(n, reference))
                    if n in r.rates
                    else "-"
                    for r in results.values()
                ),
            ]
            for n in shown
        ]
        lines += _table(["loader", *results], rows)
    if any(r.ttfb_s for r in results.values()):
        lines += ["", "Time to first batch, median ms (build + start workers + first batch)", ""]
        rows = [
            [
                n,
                *(
                    f"{statistics.median(r.ttfb_s[n]) * 1e3:.1f}" if n in r.ttfb_s else "-"
                    for r in results.values()
                ),
            ]
            for n in shown
        ]
        lines += _table(["loader", *results], rows)
    lines += ["", "CPU ms per timed batch, median: trainer process (its threads too) / workers", ""]
    rows = [
        [n, *(_cpu_cell(r, n) if n in r.main_usage else "-" for r in results.values())]
        for n in shown
    ]
    lines += _table(["loader", *results], rows)
    for r in results.values():
        lines += [
            "",
            f"Where the time goes on {r.name}, median per timed batch: CPU ms in user and "
            "kernel mode, minor page faults",
            "",
        ]
        header = ["loader", "trainer user", "trainer kernel", "trainer faults"]
        header += ["workers user", "workers kernel", "workers faults"]
        rows = [[n, *_usage_cells(r, n)] for n in shown if n in r.main_usage]
        lines += _table(header, rows)
    foreign = {
        k: f"{statistics.median(r.foreign_cores):.2f} (max {max(r.foreign_cores):.2f})"
        for k, r in results.items()
        if r.foreign_cores
    }
    if foreign:
        lines += [
            "",
            "CPUs kept busy by other processes during the timed batches, median (max): "
            + ", ".join(f"{k} {v}" for k, v in foreign.items()),
        ]
    large = results.get("large")
    bandwidth = large.bandwidth if large is not None else None
    if large is not None and bandwidth is not None:
        limit = bandwidth.best / large.batch_bytes
        memory_limit = bandwidth.memory_bound / large.batch_bytes
        lines += [
            "",
            f"Copy bandwidth, median GB/s, one thread / {bandwidth.threads} threads at once: "
            f"np.copyto of {bandwidth.nbytes / 2**20:.0f} MiB {bandwidth.copyto_one / 1e9:.1f} / "
            f"{bandwidth.copyto_all / 1e9:.1f}; the collation alone (np.stack of the batch's "
            f"arrays into a reused buffer) {bandwidth.stack_one / 1e9:.1f} / "
            f"{bandwidth.stack_all / 1e9:.1f}. A large batch is "
            f"{large.batch_bytes / 2**20:.0f} MiB and needs at least that one copy, so the "
            f"machine allows at most {limit:.0f} batches/s (the best of the four). Into "
            f"{IN_FLIGHT} buffers taken in turn (as many batches as a loader keeps in flight, "
            f"more than the caches hold), the collation runs at {bandwidth.turns_one / 1e9:.1f}"
            f" / {bandwidth.turns_all / 1e9:.1f} GB/s: at most {memory_limit:.0f} batches/s.",
            "",
        ]
        rows = [
            [
                n,
                f"{large.median(n):.1f}",
                f"{large.median(n) / limit:.0%}",
                f"{large.median(n) / memory_limit:.0%}",
            ]
            for n in shown
            if n in large.rates
        ]
        lines += _table(
            [
                "loader",
                "batches/s",
                "share of the copy-bound limit",
                "share of the memory-bound limit",
            ],
            rows,
        )
    checked = sorted({n for r in results.values() for n in r.checked_epochs})
    lines += [
        "",
        "Exactly once: every sample arrived exactly once in each of "
        + ", ".join(
            f"{n} ({sum(r.checked_epochs.get(n, 0) for r in results.values())} epochs)"
            for n in checked
        ),
    ]
    for name, why in unavailable.items():
        lines.append(f"unavailable: {name}: {why}")
    return "\n".join(lines)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated subset of %(default)s"
    )
    parser.add_argument(
        "--loaders",
        default=",".join(LOADERS),
        help="comma-separated subset of %(default)s (also: " + ",".join(OPTIONAL_LOADERS) + ")",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and 2 rounds: a smoke run"
    )
    parser.add_argument(
        "--no-ttfb", action="store_true", help="skip the time-to-first-batch measurements"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to SECONDS for other processes to leave the CPUs idle",
    )
    parser.add_argument("--json", metavar="OUT", help="also write every per-round figure to OUT")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    if not workloads or any(w not in WORKLOADS for w in workloads):
        parser.error(f"--workloads takes a subset of {','.join(WORKLOADS)}, got {args.workloads!r}")
    known = (*LOADERS, *OPTIONAL_LOADERS)
    if not names or any(n not in known for n in names):
        parser.error(f"--loaders takes a subset of {','.join(known)}, got {args.loaders!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be a positive integer, got {args.rounds}")
    rounds = min(args.rounds, 2) if args.quick else args.rounds
    ttfb_rounds = 0 if args.no_ttfb else (1 if args.quick else rounds)

    command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    env = environment()
    _progress(f"{env['cpus']} CPUs; {rounds} rounds of {', '.join(names)}")
    unavailable: dict[str, str] = {}
    results: dict[str, WorkloadResult] = {}
    start = time.perf_counter()
    for workload in workloads:
        _progress(f"{workload}: {WORKLOADS[workload].description}")
        results[workload] = run_workload(
            WORKLOADS[workload], names, rounds, args.quick, unavailable, ttfb_rounds, args.wait_idle
        )
    _progress(f"done in {time.perf_counter() - start:.0f} s")
    env["load_average_end"] = f"{os.getloadavg()[0]:.2f}"
    print()
    print(render(results, names, unavailable, env, command))
    if args.json:
        payload = {
            "command": command,
            "environment": env,
            "unavailable": unavailable,
            "workloads": {k: asdict(v) for k, v in results.items()},
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
