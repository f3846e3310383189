"""The resume oracle: a drawn configuration, a drawn save point, and the uninterrupted run.

A :class:`Config` says what a loader reads (dataset kind, sampler, batching, seed) and how
(workers, their kind, order, persistence, pinning). :func:`check_resume` runs it three ways:

1. the reference: ``epochs`` epochs, uninterrupted;
2. the interrupted run: the same loader stopped at a :class:`SavePoint` (before ``iter()``,
   right after it, after ``k`` batches of an epoch, after its last batch, after its
   ``StopIteration``), where ``state_dict()`` is taken;
3. the resumed run: a *new* loader built with another allowed way of loading
   (``resumed``), given the state, run for the epochs left.

What it asserts: the interrupted run's batches followed by the resumed run's equal the
reference, batch for batch, random draws inside samples included. Where the order depends
on timing (``in_order=False``) or on the number of workers (a stream read by another number
of workers), each epoch must hold the reference epoch's samples, each exactly once. The one
other allowed outcome is a clear refusal: a ``ValueError`` from ``state_dict()``,
``load_state_dict()`` or the resumed loader's first batch whose text matches one of
:data:`REFUSALS`.

The datasets live here, at module level, so spawned workers can import them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from harness.save_load import to_plain
from stoker import (
    BucketBatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    ShuffleBuffer,
    WeightedRandomSampler,
    get_worker_info,
    sample_rng,
)
from stoker.samplers import ShardSampler

__all__ = [
    "ORACLE_SETTINGS",
    "REFUSALS",
    "Config",
    "Loading",
    "SavePoint",
    "check_resume",
    "run_epochs",
]

# Each example runs several loaders with workers: the oracles draw a quarter of the profile's
# examples. Under the default profile they draw the same examples every run, so the suite
# passes or fails for what changed in the code; `--hypothesis-profile=long` searches afresh.
_DEEP = settings().max_examples >= 1000
ORACLE_SETTINGS = settings(
    max_examples=max(10, settings().max_examples // 4),
    deadline=None,
    derandomize=not _DEEP,
    suppress_health_check=[HealthCheck.too_slow],
)

# What a loader may answer instead of resuming: each a documented limit, said in words.
REFUSALS = [
    re.compile(pattern)
    for pattern in (
        r"thread workers share one .* object, so it holds one place for all of them",
        r"cannot say which records each shard delivered, so it resumes only with the same number",
        r"persistent workers each held their own copy of .*: each copy resumes in its own worker",
    )
]


# -- datasets ----------------------------------------------------------------------------
def _draws(i: int) -> dict[str, Any]:
    """A sample with the random draws augmentations make: global numpy, random, stoker's."""
    return {
        "i": i,
        "np": float(np.random.rand()),
        "py": random.random(),
        "rng": sample_rng().random(),
    }


class MapNoisy:
    """A map-style dataset of ``n`` samples with random draws; safe for thread workers."""

    thread_safe = True

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _draws(int(i))


def _my_share(n: int, start: int) -> Iterator[int]:
    """The indices from ``start`` that this worker reads (all of them without workers)."""
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return (i for i in range(start, n) if i % workers == worker)


class StatefulStream(IterableDataset):
    """A stream of ``n`` samples split by worker; its state is the next index it reads."""

    def __init__(self, n: int, length: int | None = None) -> None:
        self.n, self.length, self.pos = n, length, 0

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this stream has no length")
        return self.length

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in _my_share(self.n, self.pos):
            self.pos = i + 1
            yield _draws(i)
        self.pos = 0

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]


class StatelessStream(IterableDataset):
    """A stream split by worker with no state of its own."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (_draws(i) for i in _my_share(self.n, 0))


class OwnIteratorStream(IterableDataset):
    """A stream that is its own iterator: ``__iter__`` rewinds it, its state is its place."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0
        self._share: Iterator[int] = iter(())

    def __iter__(self) -> OwnIteratorStream:
        self.pos = 0
        self._share = _my_share(self.n, 0)
        return self

    def __next__(self) -> dict[str, Any]:
        for i in self._share:
            if i >= self.pos:
                self.pos = i + 1
                return _draws(i)
        raise StopIteration

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]


DATASETS = ("map", "stream", "stream-wrong-len", "stream-stateless", "own-iterator", "shuffled")
STREAMS = frozenset(DATASETS) - {"map"}


# -- configurations ----------------------------------------------------------------------
@dataclass(frozen=True)
class Loading:
    """How a loader loads; what a resumed loader may change."""

    num_workers: int = 0
    worker_mode: str = "process"
    in_order: bool = True
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    pin_memory: bool = False  # stoker.torch only: a pinning thread that reads ahead

    def options(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.pin_memory:
            del out["pin_memory"]
        if not self.num_workers:
            return {key: out[key] for key in ("num_workers", "pin_memory") if key in out}
        if self.prefetch_factor is None:
            del out["prefetch_factor"]
        return out


@dataclass(frozen=True)
class Config:
    """What a loader reads, and how the first (interrupted) loader loads it."""

    dataset: str = "map"
    n: int = 13
    batch_size: int | None = 3
    drop_last: bool = False
    sampler: str = "default"  # default, shuffle, random, random-replacement, weighted, ...
    seed: int | None = 5  # the loader's generator; None: drawn from the global generators
    torch_loader: bool = False  # stoker.torch.DataLoader (torch batches, torch samplers)
    torch_generator: bool = False  # the seed given as a torch.Generator (torch loader only)
    loading: Loading = Loading()
    resumed: Loading = Loading()
    epochs: int = 2
    global_seed: int = 0

    def allowed(self) -> Config:
        """This configuration with a resumed way of loading that may reproduce it.

        A torch.Generator gives each new iterator a base seed, except that persistent
        workers keep theirs (torch's rule): a resumed loader that differs in that respect
        seeds its later epochs otherwise, by design. A stream's workers each drop their own
        last, short batch with ``drop_last``: read by another number of workers it drops
        other samples, so such a resume keeps every batch.
        """
        if self.stream and _comparison(self) == "samples" and self.drop_last:
            return dataclasses.replace(self, drop_last=False)
        if not (self.torch_generator and self.torch_loader and self.seed is not None):
            return self
        keeps = self.loading.persistent_workers and self.loading.num_workers > 0
        resumed = self.resumed
        if keeps and not (resumed.persistent_workers and resumed.num_workers > 0):
            resumed = dataclasses.replace(
                resumed, num_workers=max(1, resumed.num_workers), persistent_workers=True
            )
        elif not keeps and resumed.persistent_workers:
            resumed = dataclasses.replace(resumed, persistent_workers=False)
        return dataclasses.replace(self, resumed=resumed)

    @property
    def stream(self) -> bool:
        return self.dataset in STREAMS

    def build(self, loading: Loading) -> DataLoader:
        """A fresh loader of this configuration, loading as ``loading`` says."""
        dataset = self._dataset()
        loader_cls: Any = DataLoader
        generator: Any = self.seed
        if self.torch_loader:
            import torch

            from stoker.torch import DataLoader as loader_cls

            if self.torch_generator and self.seed is not None:
                generator = torch.Generator().manual_seed(self.seed)
        kwargs: dict[str, Any] = {"generator": generator, **loading.options()}
        if self.sampler == "shuffle":
            kwargs["shuffle"] = True
        elif self.sampler == "bucketing":
            lengths = [(i * 7) % 5 + 1 for i in range(self.n)]
            seed = 3 if self.seed is None else self.seed
            batches = BucketBatchSampler(lengths, self.batch_size or 2, generator=seed)
            return loader_cls(dataset, batch_sampler=batches, **kwargs)
        elif self.sampler != "default":
            kwargs["sampler"] = self._sampler(dataset)
        return loader_cls(dataset, batch_size=self.batch_size, drop_last=self.drop_last, **kwargs)

    def _dataset(self) -> Any:
        n = self.n
        if self.dataset == "map":
            return MapNoisy(n)
        if self.dataset == "stream":
            return StatefulStream(n)
        if self.dataset == "stream-wrong-len":
            return StatefulStream(n, length=max(1, n - 4))
        if self.dataset == "stream-stateless":
            return StatelessStream(n)
        if self.dataset == "own-iterator":
            return OwnIteratorStream(n)
        return ShuffleBuffer(StatefulStream(n), size=4)

    def _sampler(self, dataset: Any) -> Any:
        n, seed = self.n, 3 if self.seed is None else self.seed
        if self.sampler == "random":
            return RandomSampler(dataset, generator=self.seed)
        if self.sampler == "random-replacement":
            return RandomSampler(dataset, replacement=True, num_samples=n + 2, generator=seed)
        if self.sampler == "weighted":
            return WeightedRandomSampler(np.linspace(0.1, 1, n), n, generator=seed)
        if self.sampler == "distributed":
            return DistributedSampler(dataset, num_replicas=2, rank=1, seed=seed)
        if self.sampler == "shards":
            sizes = _cut([4, 2, 5, 3, 6, 1] * (n // 21 + 1), n)
            return ShardSampler(dataset, shard_sizes=sizes, num_replicas=2, rank=1, seed=seed)
        import torch

        own = self.sampler == "torch-random-generator"
        generator = torch.Generator().manual_seed(seed) if own else None
        return torch.utils.data.RandomSampler(dataset, generator=generator)


def _cut(sizes: list[int], n: int) -> list[int]:
    """Shard sizes that add up to ``n``."""
    out, total = [], 0
    for size in sizes:
        if total + size >= n:
            out.append(n - total)
            return out
        out.append(size)
        total += size
    out.append(n - total)
    return out


@dataclass(frozen=True)
class SavePoint:
    """Where the state is taken: in ``epoch``, after ``batches`` of its batches.

    ``batches``: -2 before ``iter()``, -1 right after it, ``k >= 0`` after the k-th batch
    (0: after the first ``next()`` was not yet called), and ``None`` after ``StopIteration``.
    """

    epoch: int
    batches: int | None


# -- running -----------------------------------------------------------------------------
def _seed_globals(seed: int) -> None:
    np.random.seed(seed)
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import torch

        torch.manual_seed(seed)


def _key(batch: Any) -> str:
    return json.dumps(to_plain(batch), sort_keys=True, default=repr)


def run_epochs(loader: DataLoader, epochs: int) -> list[list[str]]:
    """Each epoch's batches, as canonical strings."""
    return [[_key(b) for b in loader] for _ in range(epochs)]


def _interrupted(config: Config, point: SavePoint) -> tuple[list[list[str]], dict[str, Any], bool]:
    """The batches before the save point, epoch by epoch, the state taken there, and whether
    it was taken after the epoch's ``StopIteration`` (an epoch shorter than the point)."""
    _seed_globals(config.global_seed)
    loader = config.build(config.loading)
    head: list[list[str]] = []
    try:
        for epoch in range(point.epoch + 1):
            head.append([])
            if epoch == point.epoch and point.batches == -2:
                return head, loader.state_dict(), False
            iterator = iter(loader)
            if epoch == point.epoch and point.batches == -1:
                return head, loader.state_dict(), False
            for batch in iterator:
                head[-1].append(_key(batch))
                if epoch == point.epoch and len(head[-1]) == point.batches:
                    return head, loader.state_dict(), False
            if epoch == point.epoch:  # after StopIteration (or fewer batches than asked)
                return head, loader.state_dict(), True
        raise AssertionError(f"the save point {point} is past the run")
    finally:
        loader.close()


def _refused(exc: ValueError) -> bool:
    return any(pattern.search(str(exc)) for pattern in REFUSALS)


@contextlib.contextmanager
def _pinning_on_cpu(config: Config) -> Iterator[None]:
    """``pin_memory=True`` on a machine without an accelerator: the real pinning thread, its
    read-ahead and its take-back, with an identity in place of the copy to pinned memory."""
    if not config.torch_loader:
        yield
        return
    from stoker.torch import _loader

    chosen = _loader.accelerator_pin_function
    _loader.accelerator_pin_function = lambda: (lambda batch: batch, None)
    try:
        yield
    finally:
        _loader.accelerator_pin_function = chosen


def check_resume(config: Config, point: SavePoint) -> str:
    """Checks the resumed run against the reference; returns ``"resumed"`` or ``"refused"``."""
    with _pinning_on_cpu(config):
        return _check_resume(config, point)


def _check_resume(config: Config, point: SavePoint) -> str:
    _seed_globals(config.global_seed)
    reference_loader = config.build(config.loading)
    try:
        expected = run_epochs(reference_loader, config.epochs)
    finally:
        reference_loader.close()
    try:
        head, state, after_stop = _interrupted(config, point)
    except ValueError as exc:
        if _refused(exc):
            return "refused"
        raise
    # a resumed process: the same global seed (the one a script sets at its top)
    _seed_globals(config.global_seed)
    resumed = config.build(config.resumed)
    tail: list[list[str]] = []
    try:
        resumed.load_state_dict(state)
        first_epoch = point.epoch + 1 if after_stop else point.epoch
        for _ in range(first_epoch, config.epochs):
            tail.append([_key(b) for b in resumed])
    except ValueError as exc:
        if _refused(exc):
            return "refused"
        raise
    finally:
        resumed.close()
    got = [list(epoch) for epoch in head]
    if after_stop:
        got.extend(tail)
    else:
        got[-1].extend(tail[0] if tail else [])
        got.extend(tail[1:])
    _compare(config, f"{point} (after StopIteration: {after_stop})", state, got, expected)
    return "resumed"


def _comparison(config: Config) -> str:
    """How the runs are compared: ``"exact"`` (batch for batch), ``"batches"`` (each epoch's
    batches in any order: ``in_order=False``) or ``"samples"`` (each epoch's sample indices:
    a stream read by another number of workers is batched and interleaved otherwise)."""
    if config.stream:
        workers = {config.loading.num_workers, config.resumed.num_workers}
        if len(workers) > 1 and workers != {0, 1}:
            return "samples"
    if not (config.loading.in_order and config.resumed.in_order):
        return "batches"
    return "exact"


def _indices(epoch: list[str]) -> list[int]:
    out: list[int] = []
    for key in epoch:
        i = json.loads(key)["i"]
        out.extend(i if isinstance(i, list) else [i])
    return sorted(out)


def _compare(
    config: Config, point: str, state: Any, got: list[list[str]], expected: list[list[str]]
) -> None:
    where = f"{config}\nsaved at {point}: {state!r}"
    assert len(got) == len(expected), f"{len(got)} epochs != {len(expected)}\n{where}"
    how = _comparison(config)
    for epoch, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        if how == "exact":
            assert ours == theirs, f"epoch {epoch} differs\n{ours}\n!=\n{theirs}\n{where}"
        elif how == "batches":
            assert sorted(ours) == sorted(theirs), (
                f"epoch {epoch}: not the same batches\n{sorted(ours)}\n!=\n{sorted(theirs)}\n"
                f"{where}"
            )
        else:
            assert _indices(ours) == _indices(theirs), (
                f"epoch {epoch}: not the same samples\n{_indices(ours)}\n!=\n{_indices(theirs)}"
                f"\n{where}"
            )
