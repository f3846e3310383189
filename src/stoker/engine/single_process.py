"""Loading in the calling thread (``num_workers=0``): one epoch, no workers, no shared memory.

The same fetchers the workers run (:mod:`stoker.engine.fetch`) load each batch where the
trainer asks for it, so a batch and its random draws are the same with and without workers.
Like :class:`~stoker.engine.multi_worker.MultiWorkerIterator`, it works from the loader's
:class:`~stoker.engine.messages.WorkerSpec` (what to load) and
:class:`~stoker.engine.plan.EpochPlan` / :class:`~stoker.engine.plan.EpochHooks` (how to run
the epoch, what to report), never from the loader itself.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterator
from time import perf_counter
from typing import Any

from stoker._resume import Progress
from stoker._skipped import SKIPPED
from stoker.engine.fetch import AllSkipped, IterableFetcher, MapFetcher
from stoker.engine.messages import WorkerSpec, add_note
from stoker.engine.plan import EpochHooks
from stoker.profiling.stats import StatsRecorder

__all__ = ["SingleProcessIterator"]


class SingleProcessIterator:
    """Loads every batch of one epoch in the calling thread.

    Args:
        spec: what to load (dataset, collate, batch size), as a worker would get it.
        hooks: what it calls back (delivery, bad-sample accounting).
        progress: where the epoch stands (shared with the loader for ``state_dict``).
        index_iter: the epoch's index batches from the first one to load (map-style), or
            None for an iterable dataset.
        first_position: the place in the epoch of that batch's first sample.
        stats: where stage times go (``loader.stats()``).
        take_backs: deliveries a state may take back (a pinning thread's read-ahead): the
            stream's state after each of that many last batches is captured and kept.
    """

    __slots__ = (
        "__weakref__", "_batch_index", "_captures", "_deliver", "_delivered_ahead", "_fetcher",
        "_finalizer", "_index_iter", "_position", "_progress", "_record_bad_samples", "_recorder",
    )  # fmt: skip

    def __init__(
        self,
        spec: WorkerSpec,
        hooks: EpochHooks,
        *,
        progress: Progress,
        index_iter: Iterator[Any] | None,
        first_position: int,
        stats: StatsRecorder,
        take_backs: int = 0,
    ) -> None:
        self._deliver = hooks.deliver
        self._record_bad_samples = hooks.record_bad_samples
        self._recorder = stats
        self._progress = progress
        self._index_iter = index_iter
        self._batch_index = progress.floor
        # batches a resumed epoch had delivered out of order beyond its floor: never loaded
        # again (a copy: ``progress.ahead`` shrinks as deliveries reach them)
        self._delivered_ahead = frozenset(progress.ahead)
        self._position = first_position
        self._fetcher: MapFetcher | IterableFetcher
        self._captures: collections.deque[Any] | None = None
        self._finalizer: weakref.finalize | None = None
        if index_iter is None:
            fetcher = self._fetcher = IterableFetcher(
                spec.dataset,
                spec.batch_size,
                spec.collate_fn,
                spec.drop_last,
                progress.seed,
                resume=progress.resume_streams.get(0),
            )
            progress.samples = fetcher.taken
            if take_backs:
                self._captures = collections.deque([fetcher.capture()], maxlen=take_backs + 1)
            # closed (or dropped) before its end, it keeps where the stream stood
            self._finalizer = weakref.finalize(self, _keep_stream, fetcher, progress)
        else:
            self._fetcher = MapFetcher(
                spec.dataset, spec.auto_collation, spec.collate_fn, spec.skip_errors
            )

    def __iter__(self) -> SingleProcessIterator:
        return self

    def __next__(self) -> Any:
        progress = self._progress
        entered = perf_counter()
        while True:
            try:
                batch = (
                    self._fetch_stream(progress)
                    if self._index_iter is None
                    else self._fetch_map(progress)
                )
            except StopIteration:
                progress.done = True
                raise
            except AllSkipped:
                batch = SKIPPED
            progress.deliver(self._batch_index)
            self._batch_index += 1
            if self._captures is not None:
                self._captures.append(self._fetcher.capture())  # type: ignore[union-attr]
            if batch is not SKIPPED:
                self._recorder.delivered(perf_counter() - entered)
                return self._deliver(batch)

    def _fetch_stream(self, progress: Progress) -> Any:
        fetcher: IterableFetcher = self._fetcher  # type: ignore[assignment]
        began = perf_counter()
        batch = fetcher.fetch(self._batch_index)
        samples = fetcher.taken - progress.samples
        progress.samples = fetcher.taken
        self._recorder.loaded(None, samples, perf_counter() - began, 0.0, self._batch_index)
        return batch

    def _fetch_map(self, progress: Progress) -> Any:
        fetcher: MapFetcher = self._fetcher  # type: ignore[assignment]
        began = perf_counter()
        index = next(self._index_iter)  # type: ignore[arg-type]
        while self._batch_index in self._delivered_ahead:  # delivered before a resume: skip it
            self._position += len(index) if fetcher.auto_collation else 1
            self._batch_index += 1
            index = next(self._index_iter)  # type: ignore[arg-type]
        self._recorder.stats.sampling_s += perf_counter() - began
        attempted = len(index) if fetcher.auto_collation else 1
        self._position += attempted
        try:
            batch = fetcher.fetch(
                index, progress.seed, self._batch_index, self._position - attempted
            )
        finally:
            if self._record_bad_samples is not None:
                self._record_bad_samples(attempted, fetcher.take_skipped())
        self._recorder.loaded(
            None, attempted, fetcher.fetch_s, fetcher.collate_s, index, fetcher.slow_samples
        )
        return batch

    def stream_states(self, held: int) -> tuple[dict[int, Any], int]:
        """The stream's state (``{0: state}``, as by worker) as if the last ``held``
        deliveries had not happened, and ``0``: the worker whose batch comes next."""
        fetcher: IterableFetcher = self._fetcher  # type: ignore[assignment]
        if not held:
            return {0: fetcher.state_of(fetcher.capture())}, 0
        captures = self._captures
        if captures is None or held >= len(captures):
            kept = 0 if captures is None else len(captures) - 1
            raise AssertionError(f"cannot take back {held} deliveries, only {kept} are kept")
        return {0: fetcher.state_of(captures[-1 - held])}, 0

    def close(self) -> None:
        """Ends the epoch (an iterable dataset's keeps where its stream stood); safe twice."""
        if self._finalizer is not None:
            self._finalizer()


def _keep_stream(fetcher: IterableFetcher, progress: Progress) -> None:
    """An epoch closed or dropped before its end keeps its stream's state in ``progress``."""
    if progress.done:
        return
    with progress.stream_lock:
        if progress.kept_streams is None:
            try:
                progress.kept_streams = ({0: fetcher.state_of(fetcher.capture())}, 0)
            except Exception as exc:  # told by the state_dict() that needs it
                add_note(
                    exc,
                    "stoker: raised when the epoch's iterator closed before its end and captured "
                    "where its stream stood, for a later state_dict()",
                )
                progress.kept_streams = exc
