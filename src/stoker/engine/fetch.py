"""Fetchers: from an index batch (map-style) or a stream (iterable) to a collated batch.

The same fetcher runs in the main process (``num_workers=0``) and inside each worker,
so the two paths cannot drift apart. A fetcher also opens the random scopes of
``random_scopes.py`` (the story is in :mod:`stoker.seeding`): global random draws while
loading sample ``p`` of an epoch are seeded from ``(epoch seed, p)``, those in
``__getitems__`` and ``collate_fn`` from ``(epoch seed, batch index)``, so augmentations do
not depend on which worker runs them.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Any

from stoker._state_capture import capture, captured, holds_state
from stoker._worker_info import _set_worker_info, worker_info_here
from stoker.bad_samples import SkippedSample, skipped_sample
from stoker.engine import random_scopes
from stoker.engine.messages import add_note
from stoker.profiling.stats import PROFILE_SAMPLES

_sample_log = logging.getLogger("stoker.samples")
_KEEP_SLOW_SAMPLES = 5

__all__ = ["AllSkipped", "IterableFetcher", "MapFetcher"]


class AllSkipped(Exception):
    """Every sample of the batch failed and was skipped: there is no batch to return."""


class MapFetcher:
    """Fetches the samples of one index batch and collates them.

    A dataset with a ``__getitems__`` method is asked for the whole batch at once
    (torch's rule: the attribute must exist and be truthy). With ``skip_errors`` a sample
    that raises is left out and recorded in :attr:`skipped` (a failing ``__getitems__``
    is retried sample by sample to find the culprits); a batch that loses every sample
    raises :class:`AllSkipped`.
    """

    __slots__ = (
        "_collate",
        "_dataset",
        "_getitems",
        "auto_collation",
        "collate_s",
        "fetch_s",
        "skip_errors",
        "skipped",
        "slow_samples",
    )

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        skip_errors: bool = False,
    ):
        self._dataset = dataset
        self._collate = collate_fn
        self.auto_collation = auto_collation
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if getitems else None
        self.skip_errors = skip_errors
        self.skipped: list[SkippedSample] = []
        self.fetch_s = self.collate_s = 0.0  # the last batch's stage times
        self.slow_samples: tuple[tuple[float, Any], ...] = ()  # STOKER_PROFILE_SAMPLES=1 only

    def take_skipped(self) -> tuple[SkippedSample, ...]:
        """The samples skipped since the last call."""
        skipped, self.skipped = tuple(self.skipped), []
        return skipped

    def fetch(
        self, index: Any, epoch_seed: int, batch_index: int, position: int, threads: int = 1
    ) -> Any:
        """Returns the collated batch for ``index`` (a list of indices when batching).

        ``batch_index`` is the batch's place in the epoch and ``position`` the place of
        its first sample: they key the random scopes. ``threads`` > 1 loads the samples
        in that many threads at once (thread workers' first batch, see
        :mod:`stoker.engine.head_start`; not for ``__getitems__``, which gets the batch whole).
        """
        dataset = self._dataset
        start = perf_counter()
        if not self.auto_collation:
            scope, previous = random_scopes.begin(epoch_seed, random_scopes.SAMPLE)
            try:
                scope.position, scope.index = position, index
                sample = dataset[index]
            except Exception as exc:
                if not self.skip_errors:
                    note_sample(exc, dataset, index, batch_index)
                    raise
                self.skipped.append(skipped_sample(dataset, index, exc))
                raise AllSkipped from None
            finally:
                random_scopes.end(previous)
            return self._timed_collate(sample, epoch_seed, batch_index, start, index)
        if self.skip_errors:
            samples = self._fetch_skipping(index, epoch_seed, batch_index, position, threads)
        elif self._getitems is not None:
            scope, previous = random_scopes.begin(epoch_seed, random_scopes.BATCH)
            try:
                scope.position, scope.index = batch_index, index
                samples = self._getitems(index)
            except Exception as exc:
                add_note(
                    exc,
                    f"stoker: raised by {type(dataset).__name__}.__getitems__ for batch "
                    f"{batch_index} (dataset indices {summary(index)})",
                )
                raise
            finally:
                random_scopes.end(previous)
        elif PROFILE_SAMPLES:
            samples = self._fetch_timing_samples(index, epoch_seed, position)
        else:
            samples = self._fetch_runs(index, epoch_seed, batch_index, position, threads, False)
        return self._timed_collate(samples, epoch_seed, batch_index, start, index)

    def _fetch_runs(
        self,
        index: Any,
        epoch_seed: int,
        batch_index: int,
        position: int,
        threads: int,
        skip: bool,
    ) -> list[Any]:
        """The batch's samples, in order: loaded by this thread alone, or split into
        ``threads`` runs of consecutive samples loaded at once (this thread loads the first).

        Each sample is loaded in its own random scope wherever it runs, so the samples are
        the same either way. The error of the first failing sample (in batch order) is
        raised; with ``skip``, failing samples are recorded in :attr:`skipped` in order.
        """
        indices = index if isinstance(index, list) else list(index)
        count = min(threads, len(indices))
        if count <= 1:
            samples, skipped = self._load_run(
                indices, epoch_seed, batch_index, position, index, skip
            )
            self.skipped.extend(skipped)
            return samples
        bounds = [len(indices) * k // count for k in range(count + 1)]
        runs = [(bounds[k], indices[bounds[k] : bounds[k + 1]]) for k in range(count)]
        info = worker_info_here()

        def load(run: tuple[int, list[Any]]) -> tuple[list[Any], list[SkippedSample]]:
            _set_worker_info(info)  # the helper loads for this worker: it sees its info
            try:
                return self._load_run(
                    run[1], epoch_seed, batch_index, position + run[0], index, skip
                )
            finally:
                _set_worker_info(None)

        name = f"{threading.current_thread().name}-helper"
        with ThreadPoolExecutor(count - 1, thread_name_prefix=name) as helpers:
            futures = [helpers.submit(load, run) for run in runs[1:]]
            # the first run's error comes first in batch order (leaving the block waits for
            # the helpers); then each helper's, in order
            first = self._load_run(runs[0][1], epoch_seed, batch_index, position, index, skip)
            samples, skipped = list(first[0]), list(first[1])
            for future in futures:
                more, more_skipped = future.result()  # raises the run's error, in order
                samples.extend(more)
                skipped.extend(more_skipped)
        self.skipped.extend(skipped)
        return samples

    def _load_run(
        self,
        indices: list[Any],
        epoch_seed: int,
        batch_index: int,
        position: int,
        batch: Any,
        skip: bool,
    ) -> tuple[list[Any], list[SkippedSample]]:
        """Loads ``indices`` (the batch's samples from ``position`` on) in this thread, each
        in its own random scope; the samples, and with ``skip`` the ones that failed."""
        dataset = self._dataset
        samples: list[Any] = []
        skipped: list[SkippedSample] = []
        append = samples.append
        scope, previous = random_scopes.begin(epoch_seed, random_scopes.SAMPLE)
        i = None
        try:
            for offset, i in enumerate(indices):
                scope.position, scope.index = position + offset, i
                if not skip:
                    append(dataset[i])
                    continue
                try:
                    append(dataset[i])
                except Exception as exc:
                    skipped.append(skipped_sample(dataset, i, exc))
        except Exception as exc:
            note_sample(exc, dataset, i, batch_index, batch)
            raise
        finally:
            random_scopes.end(previous)
        return samples, skipped

    def _timed_collate(
        self, samples: Any, epoch_seed: int, batch_index: int, start: float, index: Any
    ) -> Any:
        fetched = perf_counter()
        batch = self._collate_in_scope(samples, epoch_seed, batch_index, index)
        self.fetch_s = fetched - start
        self.collate_s = perf_counter() - fetched
        return batch

    def _fetch_timing_samples(self, index: Any, epoch_seed: int, position: int) -> list[Any]:
        """STOKER_PROFILE_SAMPLES=1: times and logs every sample, keeps the slowest."""
        dataset, samples, slow = self._dataset, [], []
        scope, previous = random_scopes.begin(epoch_seed, random_scopes.SAMPLE)
        i = None
        try:
            for offset, i in enumerate(index):
                scope.position, scope.index = position + offset, i
                began = perf_counter()
                samples.append(dataset[i])
                seconds = perf_counter() - began
                slow.append((seconds, i))
                _sample_log.debug("sample %r loaded in %.3f ms", i, 1000 * seconds)
        except Exception as exc:
            note_sample(exc, self._dataset, i, None, index)
            raise
        finally:
            random_scopes.end(previous)
        self.slow_samples = tuple(sorted(slow, reverse=True)[:_KEEP_SLOW_SAMPLES])
        return samples

    def _fetch_skipping(
        self, index: Any, epoch_seed: int, batch_index: int, position: int, threads: int
    ) -> list[Any]:
        if self._getitems is not None:
            scope, previous = random_scopes.begin(epoch_seed, random_scopes.BATCH)
            try:
                scope.position, scope.index = batch_index, index
                return self._getitems(index)
            except Exception:
                pass  # find the bad samples one by one below
            finally:
                random_scopes.end(previous)
        samples = self._fetch_runs(index, epoch_seed, batch_index, position, threads, True)
        if not samples:
            raise AllSkipped
        return samples

    def _collate_in_scope(self, samples: Any, epoch_seed: int, batch_index: int, index: Any) -> Any:
        scope, previous = random_scopes.begin(epoch_seed, random_scopes.COLLATE)
        try:
            scope.position, scope.index = batch_index, index
            return self._collate(samples)
        except Exception as exc:
            if self.auto_collation:
                note_collated(exc, index)
            raise
        finally:
            random_scopes.end(previous)


def summary(indices: Any, limit: int = 16) -> str:
    """``indices`` for a message: all of them, or the first ``limit`` and the count."""
    try:
        flat = list(indices)
    except TypeError:
        return repr(indices)
    if len(flat) <= limit:
        return repr(flat)
    return f"[{', '.join(map(repr, flat[:limit]))}, ... ({len(flat)} in all)]"


def note_sample(
    error: BaseException, dataset: Any, index: Any, batch_index: int | None, batch: Any = None
) -> None:
    """Notes on ``error`` which dataset index raised it, and in which batch."""
    where = f"dataset[{index!r}] ({type(dataset).__name__})"
    if batch is not None:
        place = f"batch {batch_index}, " if batch_index is not None else ""
        where += f" while loading {place}dataset indices {summary(batch)}"
    add_note(error, f"stoker: raised by {where}")


_SAMPLE_REF = re.compile(r"\bsamples? (\d+)\b")


def note_collated(error: BaseException, index: Any) -> None:
    """Notes on a collate error which dataset indices the samples it names are.

    Collate messages count samples by their place in the batch ("sample 2"); the note maps
    every place the message names to its dataset index.
    """
    try:
        indices = list(index)
    except TypeError:
        return
    named = sorted({int(n) for n in _SAMPLE_REF.findall(str(error)) if int(n) < len(indices)})
    mapped = ", ".join(f"sample {n} is dataset index {indices[n]!r}" for n in named)
    batch = f"the batch holds dataset indices {summary(indices)}"
    add_note(error, f"stoker: {mapped} ({batch})" if mapped else f"stoker: {batch}")


class IterableFetcher:
    """Pulls ``batch_size`` samples from an iterable dataset's stream and collates them.

    The last, short batch is kept unless ``drop_last``; an exhausted stream raises
    ``StopIteration`` from :meth:`fetch`. Random scopes are keyed by the stream's own
    sample count (and the worker id via ``epoch_seed``): a stream's content depends on
    the worker that reads it, so its augmentations may too.

    ``resume``: the state (see :mod:`stoker.engine.stream_state`) the stream opens from, in
    this order: the dataset's state is loaded, ``iter(dataset)`` is called, the iterator's
    state is loaded into what it returned; a stream that holds neither is replayed up to
    the samples it had drawn (each drawn as it was, then dropped). A stream saved after its
    end is not iterated again: its epoch has nothing left. :meth:`capture` takes a cheap
    snapshot of where the stream stands and :meth:`state_of` makes it a state.
    """

    __slots__ = (
        "_collate",
        "_dataset",
        "_dataset_part",
        "_drop_last",
        "_ended",
        "_epoch_seed",
        "_iterator",
        "_iterator_part",
        "_opened_ended",
        "_taken",
        "batch_size",
        "replayed",
    )  # fmt: skip

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
        epoch_seed: int = 0,
        resume: Mapping[str, Any] | None = None,
    ):
        self._epoch_seed = epoch_seed
        self._dataset = dataset
        self._collate = collate_fn
        self._drop_last = drop_last
        self.batch_size = batch_size
        self._taken = 0  # samples drawn this epoch so far (a resumed stream starts later)
        self.replayed = 0  # samples drawn again, and dropped, to reach a stateless stream's place
        self._opened_ended: Mapping[str, Any] | None = None
        self._ended = False
        if resume is not None and resume.get("dataset") is not None:
            dataset.load_state_dict(resume["dataset"])
        if resume is not None and resume.get("ended"):
            self._iterator: Iterator[Any] = iter(())  # its epoch has nothing left
            self._opened_ended, self._ended, self._taken = resume, True, resume.get("taken", 0)
        else:
            scope, previous = random_scopes.begin(epoch_seed, random_scopes.SAMPLE)
            try:
                scope.position = -1
                self._iterator = iter(dataset)
            finally:
                random_scopes.end(previous)
        self._dataset_part = holds_state(dataset) and self._iterator is not dataset
        self._iterator_part = holds_state(self._iterator)
        if resume is None or self._opened_ended is not None:
            return
        if resume.get("iterator") is not None:
            self._iterator.load_state_dict(resume["iterator"])  # type: ignore[attr-defined]
        if resume.get("replay"):
            self._replay(resume.get("taken", 0))
        else:
            self._taken = resume.get("taken", 0)

    def _replay(self, samples: int) -> None:
        """Draws the stream's first ``samples`` samples as the saved run drew them, and drops
        them: how a stream without a state reaches its place."""
        scope, previous = random_scopes.begin(self._epoch_seed, random_scopes.SAMPLE)
        try:
            iterator = self._iterator
            while self._taken < samples:
                scope.position = self._taken
                try:
                    next(iterator)
                except StopIteration:
                    self._ended = True
                    break
                self._taken += 1
        finally:
            random_scopes.end(previous)
        self.replayed = self._taken

    @property
    def taken(self) -> int:
        return self._taken

    @property
    def ended(self) -> bool:
        """The stream ran out while filling the last batch."""
        return self._ended

    @property
    def keeps_state(self) -> bool:
        """The dataset or its iterator holds the stream's place (else it is replayed)."""
        return self._dataset_part or self._iterator_part

    def capture(self) -> Any:
        """A cheap snapshot of where the stream stands (see stoker._state_capture)."""
        if self._opened_ended is not None:
            return self._opened_ended  # nothing was read since: the state it opened from
        return (
            capture(self._dataset) if self._dataset_part else None,
            capture(self._iterator) if self._iterator_part else None,
            self._taken,
            self._ended,
        )

    def state_of(self, snapshot: Any) -> dict[str, Any]:
        """The state a snapshot from :meth:`capture` stands for (plain values, picklable)."""
        if isinstance(snapshot, Mapping):
            return dict(snapshot)
        dataset_part, iterator_part, taken, ended = snapshot
        return {
            "dataset": None if dataset_part is None else captured(self._dataset, dataset_part),
            "iterator": (
                None if iterator_part is None else captured(self._iterator, iterator_part)
            ),
            "taken": taken,
            "ended": ended,
            "replay": not self.keeps_state,
        }

    def fetch(self, batch_index: int = 0) -> Any:
        if self._ended:
            raise StopIteration
        scope, previous = random_scopes.begin(self._epoch_seed, random_scopes.SAMPLE)
        try:
            if self.batch_size is None:
                scope.position = self._taken
                try:
                    data = next(self._iterator)
                except StopIteration:
                    self._ended = True
                    raise
                self._taken += 1
            else:
                data = []
                iterator = self._iterator
                for _ in range(self.batch_size):
                    scope.position = self._taken
                    try:
                        data.append(next(iterator))
                    except StopIteration:
                        self._ended = True
                        break
                    self._taken += 1
                if not data or (self._drop_last and len(data) < self.batch_size):
                    raise StopIteration
        finally:
            random_scopes.end(previous)
        scope, previous = random_scopes.begin(self._epoch_seed, random_scopes.COLLATE)
        try:
            scope.position = batch_index
            return self._collate(data)
        finally:
            random_scopes.end(previous)
