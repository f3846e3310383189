"""Sweeping loader settings: throughput, memory estimate and measured peak memory of each.

:func:`sweep` loads the same dataset with one :class:`stoker.DataLoader` per setting
(``num_workers`` x ``prefetch_factor``). For each it drops the warm-up batches (worker
start-up and pipeline fill), times the next ``batches`` batches, and records:

* the rate (batches/s, samples/s);
* a memory **estimate** of the batches loaded ahead: one batch's bytes (measured on the
  first batch) x ``num_workers`` x ``prefetch_factor`` (one batch with ``num_workers=0``),
  the usual prefetch budget formula;
* the **measured** peak memory: the trainer's peak resident set (``VmHWM``, reset per
  setting) plus the workers' peak private memory (``Private_*`` in
  ``/proc/<pid>/smaps_rollup``, sampled every 50 ms; see
  :class:`~stoker.tuning.peak_memory.PeakMemory`). Pages a forked worker shares with the
  trainer, and the shared-memory slots batches travel in, are counted once, in the trainer;
* how many CPUs other processes kept busy meanwhile
  (:class:`~stoker.tuning.background_load.BackgroundLoad`).

:meth:`SweepResult.knee` is the setting worth using: the fewest workers (then the smallest
prefetch) that reach 95% of the best rate. More workers past the knee buy little speed for
their memory.

Example:
    >>> import numpy as np
    >>> from stoker import ArrayDataset
    >>> from stoker.tuning import sweep
    >>> data = ArrayDataset(np.zeros((256, 8)))
    >>> result = sweep(data, batch_size=32, workers=[0], batches=4, warmup=1)
    >>> [(p.num_workers, p.batches, p.batch_bytes) for p in result.points]
    [(0, 4, 2048)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from stoker._proc import usable_cpus
from stoker._tree import leaves
from stoker._validate import check_int, is_int
from stoker.tuning.background_load import BackgroundLoad
from stoker.tuning.peak_memory import PeakMemory

__all__ = [
    "KNEE_FRACTION",
    "SweepPoint",
    "SweepProgress",
    "SweepResult",
    "batch_nbytes",
    "default_workers",
    "memory_estimate",
    "sweep",
]

KNEE_FRACTION = 0.95  # the knee is the first setting within 5% of the best rate


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """What one setting measured.

    Attributes:
        num_workers: the loader's ``num_workers``.
        prefetch_factor: its ``prefetch_factor`` (``None`` without workers).
        batches: batches timed (after the warm-up).
        samples: samples in those batches.
        seconds: wall time of the timed batches.
        warmup_seconds: from ``iter(loader)`` to the end of the warm-up (worker start-up
            and pipeline fill).
        batch_bytes: bytes of the first batch (every array or tensor in it).
        memory_estimate_bytes: ``batch_bytes x num_workers x prefetch_factor`` (one batch
            with ``num_workers=0``): the batches loaded ahead.
        peak_rss_bytes: trainer's peak resident set plus the workers' peak private memory;
            ``None`` where ``/proc`` cannot be read.
        baseline_rss_bytes: the trainer's resident set before the loader was built.
        other_cpus: how many CPUs other processes kept busy during the timed batches
            (see :class:`BackgroundLoad`); well above 0 means the figures are disturbed.

    Example:
        >>> p = SweepPoint(2, 2, batches=10, samples=640, seconds=0.5, warmup_seconds=0.1,
        ...                batch_bytes=1 << 20, memory_estimate_bytes=4 << 20,
        ...                peak_rss_bytes=None, baseline_rss_bytes=None, other_cpus=0.0)
        >>> p.batches_per_s, p.samples_per_s, p.label
        (20.0, 1280.0, 'num_workers=2, prefetch_factor=2')
    """

    num_workers: int
    prefetch_factor: int | None
    batches: int
    samples: int
    seconds: float
    warmup_seconds: float
    batch_bytes: int
    memory_estimate_bytes: int
    peak_rss_bytes: int | None
    baseline_rss_bytes: int | None
    other_cpus: float | None = None

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else float("inf")

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")

    @property
    def peak_above_baseline_bytes(self) -> int | None:
        """Peak memory minus the trainer's resident set before the loader existed."""
        if self.peak_rss_bytes is None or self.baseline_rss_bytes is None:
            return None
        return self.peak_rss_bytes - self.baseline_rss_bytes

    @property
    def label(self) -> str:
        if self.prefetch_factor is None:
            return f"num_workers={self.num_workers}"
        return f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}"


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Every setting of one sweep, in the order measured, with what they share.

    Example:
        >>> p = dict(batches=10, warmup_seconds=0.1, batch_bytes=8, memory_estimate_bytes=8,
        ...          peak_rss_bytes=None, baseline_rss_bytes=None)
        >>> result = SweepResult((SweepPoint(0, None, samples=10, seconds=1.0, **p),
        ...                       SweepPoint(1, 2, samples=10, seconds=0.52, **p),
        ...                       SweepPoint(2, 2, samples=10, seconds=0.5, **p)), batch_size=1)
        >>> result.knee().num_workers, result.best().num_workers
        (1, 2)
    """

    points: tuple[SweepPoint, ...]
    batch_size: int
    worker_mode: str = "process"
    shuffle: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def best(self) -> SweepPoint:
        """The setting with the highest rate."""
        if not self.points:
            raise ValueError("the sweep measured no setting; pass at least one num_workers value")
        return max(self.points, key=lambda p: p.samples_per_s)

    def knee(self, fraction: float = KNEE_FRACTION) -> SweepPoint:
        """The fewest workers (then the smallest prefetch) within ``fraction`` of the best rate."""
        target = self.best().samples_per_s * fraction
        ordered = sorted(self.points, key=lambda p: (p.num_workers, p.prefetch_factor or 0))
        return next(p for p in ordered if p.samples_per_s >= target)

    def knee_line(self, fraction: float = KNEE_FRACTION) -> str:
        """The knee in one sentence."""
        knee, best = self.knee(fraction), self.best()
        if knee is best:
            return (
                f"knee: {knee.label} is the fastest setting ({knee.samples_per_s:,.0f} samples/s) "
                f"and no cheaper setting comes within {100 - fraction * 100:.0f}% of it."
            )
        share = knee.samples_per_s / best.samples_per_s
        return (
            f"knee: {knee.label} reaches {share:.0%} of the best rate "
            f"({best.samples_per_s:,.0f} samples/s with {best.label}); "
            f"more workers or prefetch add under {100 - fraction * 100:.0f}% for their memory."
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the settings, every point with its rates, the knee and the best."""
        points = []
        for p in self.points:
            row = asdict(p)
            row.update(batches_per_s=p.batches_per_s, samples_per_s=p.samples_per_s)
            points.append(row)
        knee, best = self.knee(), self.best()
        return {
            "batch_size": self.batch_size,
            "worker_mode": self.worker_mode,
            "shuffle": self.shuffle,
            **dict(self.extra),
            "points": points,
            "knee": {"num_workers": knee.num_workers, "prefetch_factor": knee.prefetch_factor},
            "best": {"num_workers": best.num_workers, "prefetch_factor": best.prefetch_factor},
            "knee_line": self.knee_line(),
        }


class SweepProgress(Protocol):
    """What :func:`sweep` reports while it runs (a progress bar implements it)."""

    def begin(self, num_workers: int, prefetch_factor: int | None, total_batches: int) -> None: ...

    def advance(self) -> None: ...

    def end(self, point: SweepPoint) -> None: ...


def default_workers(cpus: int | None = None) -> tuple[int, ...]:
    """``0, 1, 2, 4, ...`` up to the CPUs this process may use (and that count itself).

    Example:
        >>> default_workers(6)
        (0, 1, 2, 4, 6)
    """
    if cpus is None:
        cpus = usable_cpus()
    counts = [0]
    n = 1
    while n <= cpus:
        counts.append(n)
        n *= 2
    if counts[-1] != cpus and cpus > 0:
        counts.append(cpus)
    return tuple(counts)


def memory_estimate(batch_bytes: int, num_workers: int, prefetch_factor: int | None) -> int:
    """Bytes of batches loaded ahead: ``batch x workers x prefetch`` (one batch without workers).

    Example:
        >>> memory_estimate(19_267_584, 8, 2) // 2**20   # 32 x 3x224x224 float32 batches
        294
    """
    if num_workers == 0:
        return batch_bytes
    return batch_bytes * num_workers * (prefetch_factor or 2)


def batch_nbytes(batch: Any) -> int:
    """Bytes of every array or tensor in a batch (nested dicts, lists and tuples included).

    Objects with an integer ``nbytes`` (numpy arrays, torch tensors) count it; strings and
    bytes their length; Python numbers 8 bytes.

    Example:
        >>> import numpy as np
        >>> batch_nbytes({"x": np.zeros((4, 3), np.float32), "y": [1, 2, 3, 4]})
        80
    """
    return sum(map(_leaf_nbytes, leaves(batch)))


def _leaf_nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(leaf, (str, bytes, bytearray)):
        return len(leaf)
    if isinstance(leaf, (int, float, complex)):
        return 8
    return 0


def sweep(
    dataset: Any,
    *,
    batch_size: int = 64,
    workers: Iterable[int] | None = None,
    prefetch: Sequence[int] = (2,),
    batches: int = 50,
    warmup: int = 5,
    worker_mode: str = "process",
    shuffle: bool = True,
    loader_options: Mapping[str, Any] | None = None,
    progress: SweepProgress | None = None,
) -> SweepResult:
    """Measures ``dataset`` under every ``num_workers`` x ``prefetch_factor`` setting.

    Args:
        dataset: a map-style or iterable dataset, as :class:`stoker.DataLoader` takes it.
        batch_size: samples per batch.
        workers: ``num_workers`` values (default :func:`default_workers`). ``0`` is
            measured once, without a prefetch factor.
        prefetch: ``prefetch_factor`` values tried with every ``num_workers > 0``.
        batches: batches to time per setting, after the warm-up.
        warmup: batches loaded and dropped before the clock starts.
        worker_mode: ``"process"`` or ``"thread"``.
        shuffle: shuffle the order (seeded; map-style datasets only).
        loader_options: further :class:`stoker.DataLoader` arguments (``collate_fn``, ...).
        progress: told about each setting and batch (see :class:`SweepProgress`).

    Returns:
        A :class:`SweepResult` with one :class:`SweepPoint` per setting.
    """
    from stoker.datasets import is_iterable_dataset
    from stoker.loader import DataLoader

    workers = _int_list("workers", tuple(default_workers() if workers is None else workers), 0)
    prefetch = _int_list("prefetch", tuple(prefetch), 1)
    batches, warmup, batch_size = (
        check_int(name, value, minimum=minimum, message=f"{name} must be an integer >= {minimum}")
        for name, value, minimum in (
            ("batches", batches, 1),
            ("warmup", warmup, 0),
            ("batch_size", batch_size, 1),
        )
    )
    settings: list[tuple[int, int | None]] = []
    for w in sorted(set(workers)):
        settings.extend([(0, None)] if w == 0 else [(w, p) for p in sorted(set(prefetch))])
    iterable = is_iterable_dataset(dataset)
    options = dict(loader_options or {})

    points = []
    for num_workers, prefetch_factor in settings:
        if progress is not None:
            progress.begin(num_workers, prefetch_factor, warmup + batches)
        extra: dict[str, Any] = {}
        if num_workers:
            extra.update(
                prefetch_factor=prefetch_factor, persistent_workers=True, worker_mode=worker_mode
            )
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle and not iterable,
            generator=0,
            num_workers=num_workers,
            **extra,
            **options,
        )
        watch = PeakMemory()
        try:
            with watch:
                point = _time_loader(
                    loader, num_workers, prefetch_factor, batches, warmup, progress
                )
        finally:
            loader.close()
        point = _with_memory(point, watch)
        points.append(point)
        if progress is not None:
            progress.end(point)
    return SweepResult(
        tuple(points), batch_size=batch_size, worker_mode=worker_mode, shuffle=shuffle
    )


def _time_loader(
    loader: Any,
    num_workers: int,
    prefetch_factor: int | None,
    batches: int,
    warmup: int,
    progress: SweepProgress | None,
) -> SweepPoint:
    """Drops ``warmup`` batches, then times ``batches``, starting new epochs as needed."""
    tick: Callable[[], None] = progress.advance if progress is not None else _nothing
    start = time.perf_counter()
    iterator = iter(loader)

    def next_batch() -> Any:
        nonlocal iterator
        try:
            return next(iterator)
        except StopIteration:
            iterator = iter(loader)
        try:
            return next(iterator)
        except StopIteration:
            msg = f"the loader yields no batch: is the dataset empty? ({loader!r})"
            raise ValueError(msg) from None

    batch_bytes = None
    for _ in range(warmup):
        batch = next_batch()
        if batch_bytes is None:
            batch_bytes = batch_nbytes(batch)
        del batch  # drop it at once, so its shared-memory slot is free for the next batch
        tick()
    samples = 0
    with BackgroundLoad() as load:
        clock = time.perf_counter()
        for _ in range(batches):
            batch = next_batch()
            if batch_bytes is None:
                batch_bytes = batch_nbytes(batch)
            samples += _batch_len(batch)
            del batch
            tick()
        seconds = time.perf_counter() - clock
    batch_bytes = batch_bytes or 0
    return SweepPoint(
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        batches=batches,
        samples=samples,
        seconds=seconds,
        warmup_seconds=clock - start,
        batch_bytes=batch_bytes,
        memory_estimate_bytes=memory_estimate(batch_bytes, num_workers, prefetch_factor),
        peak_rss_bytes=None,
        baseline_rss_bytes=None,
        other_cpus=load.cpus,
    )


def _nothing() -> None:
    return None


def _int_list(name: str, values: tuple[Any, ...], minimum: int) -> tuple[int, ...]:
    if not values or not all(is_int(v) and v >= minimum for v in values):
        msg = f"{name} must be a non-empty list of integers >= {minimum}, got {list(values)!r}"
        raise ValueError(msg)
    return tuple(int(v) for v in values)


def _batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first array (or its length)."""
    # not a _tree walk: it follows the first element only, and a list of numbers is a field
    while True:
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, Mapping) and batch:
            batch = next(iter(batch.values()))
        elif (
            isinstance(batch, (list, tuple))
            and batch
            and not isinstance(batch[0], (int, float, str, bytes))
        ):
            batch = batch[0]
        elif hasattr(batch, "__len__"):
            return len(batch)
        else:
            return 1


def _with_memory(point: SweepPoint, watch: PeakMemory) -> SweepPoint:
    fields_ = {name: getattr(point, name) for name in SweepPoint.__slots__}
    fields_.update(peak_rss_bytes=watch.peak_bytes, baseline_rss_bytes=watch.baseline_bytes)
    return SweepPoint(**fields_)
