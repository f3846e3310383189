"""``loader.stats()``: time per stage, throughput, bytes in flight, the slowest work.

Stages, in the order a batch meets them:

* **sampling**: drawing the next index batch from the sampler (trainer);
* **fetch**: ``dataset[i]`` / ``__getitems__`` (worker, or trainer with ``num_workers=0``);
* **collate**: ``collate_fn`` (same place as fetch);
* **transport**: turning a worker's message back into a batch (trainer);
* **wait**: how long the consumer was blocked in ``next()``: the one that costs GPU time.

Always on: a few clock reads per batch (well under 2% of the tiny-sample workload, see
BENCHMARKS.md). Set ``STOKER_PROFILE_SAMPLES=1`` to also time every sample, keep the
slowest and log each one on the ``stoker.samples`` logger (debug level); when it is unset
that code path is not entered at all.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import time
from dataclasses import dataclass, field
from typing import Any

from stoker._proc import ProcessMemory, process_memory

__all__ = ["PROFILE_SAMPLES", "ActorStats", "LoaderStats", "StatsRecorder"]

PROFILE_SAMPLES = os.environ.get("STOKER_PROFILE_SAMPLES", "") not in ("", "0")
_KEEP_SLOWEST = 10


@dataclass
class ActorStats:
    """One Ray actor's share of the loading (``worker_mode="ray"``), or a node's, summed.

    ``busy_s`` is fetch + collate in the actor; ``transfer_s`` is the time the trainer
    spent fetching its answers from Ray's object store (from the actor's node when it is
    another machine) and reading them. Transfer time that grows while ``busy_s`` stays
    flat means the network, not the CPUs, limits loading.
    """

    node: str
    worker_id: int | None = None  # None: a node's figures, summed over its actors
    actors: int = 1
    batches: int = 0
    samples: int = 0
    bytes: int = 0
    busy_s: float = 0.0
    transfer_s: float = 0.0

    def per_s(self, wall_s: float) -> float:
        """Batches per second over ``wall_s`` (the loader's wall time)."""
        return self.batches / wall_s if wall_s > 0 else 0.0

    @property
    def transfer_ms_per_batch(self) -> float:
        return 1000 * self.transfer_s / self.batches if self.batches else 0.0

    @property
    def busy_ms_per_batch(self) -> float:
        return 1000 * self.busy_s / self.batches if self.batches else 0.0

    @property
    def transfer_mib_per_s(self) -> float:
        """Bytes moved per second of transfer time (what the link delivered)."""
        return self.bytes / 2**20 / self.transfer_s if self.transfer_s > 0 else 0.0

    def describe(self, who: str, wall_s: float) -> str:
        return (
            f"{who}: {self.batches} batches, {self.per_s(wall_s):,.1f} batches/s, busy "
            f"{self.busy_ms_per_batch:.2f} ms/batch, transfer {self.transfer_ms_per_batch:.2f} "
            f"ms/batch ({self.bytes / 2**20:.1f} MiB, {self.transfer_mib_per_s:,.0f} MiB/s)"
        )


@dataclass
class LoaderStats:
    """A snapshot of a loader's statistics (``loader.stats()``).

    Times are seconds summed over the batches counted; ``*_per_batch_ms`` divide them.
    Fetch and collate are summed over workers, so with N workers they can exceed the
    wall time N-fold. ``slowest_batches`` and ``slowest_samples`` hold ``(seconds,
    what)`` pairs, slowest first (samples only with ``STOKER_PROFILE_SAMPLES=1``).

    Example:
        >>> import numpy as np
        >>> from stoker import ArrayDataset, DataLoader
        >>> loader = DataLoader(ArrayDataset(np.arange(8)), batch_size=4)
        >>> _ = list(loader)
        >>> loader.stats().batches
        2
    """

    batches: int = 0
    samples: int = 0
    wall_s: float = 0.0
    sampling_s: float = 0.0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    transport_s: float = 0.0
    wait_s: float = 0.0
    num_workers: int = 0
    worker_mode: str = ""  # the kind of the running workers: "process", "thread" ("" if none)
    worker_busy_s: dict[int, float] = field(default_factory=dict)
    worker_idle_s: float = 0.0  # all workers' time waiting for a task (autotuning reads it)
    memory: dict[str, ProcessMemory] = field(default_factory=dict)  # "trainer", "worker 0", ...
    autotune: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a state or a resume cost, once each
    bytes_in_flight: int = 0
    slowest_batches: list[tuple[float, Any]] = field(default_factory=list)
    slowest_samples: list[tuple[float, Any]] = field(default_factory=list)
    # Ray actors (worker_mode="ray"), by actor name; a replaced actor keeps its line
    actors: dict[str, ActorStats] = field(default_factory=dict)

    @property
    def nodes(self) -> dict[str, ActorStats]:
        """The actors' figures summed per node (``worker_mode="ray"``; empty otherwise)."""
        out: dict[str, ActorStats] = {}
        for actor in self.actors.values():
            node = out.get(actor.node)
            if node is None:
                out[actor.node] = dataclasses.replace(actor, worker_id=None)
                continue
            node.actors += 1
            node.batches += actor.batches
            node.samples += actor.samples
            node.bytes += actor.bytes
            node.busy_s += actor.busy_s
            node.transfer_s += actor.transfer_s
        return out

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def per_batch_ms(self, stage: str) -> float:
        return 1000 * getattr(self, f"{stage}_s") / self.batches if self.batches else 0.0

    @property
    def worker_utilisation(self) -> float:
        """Share of the workers' wall time spent loading (0..1); 0 without workers."""
        if not self.num_workers or self.wall_s <= 0:
            return 0.0
        return min(1.0, sum(self.worker_busy_s.values()) / (self.wall_s * self.num_workers))

    def __str__(self) -> str:
        lines = [
            f"{self.batches} batches, {self.samples} samples in {self.wall_s:.2f} s: "
            f"{self.batches_per_s:,.1f} batches/s, {self.samples_per_s:,.0f} samples/s",
            "per batch: "
            + ", ".join(
                f"{stage} {self.per_batch_ms(stage):.3f} ms"
                for stage in ("sampling", "fetch", "collate", "transport", "wait")
            ),
        ]
        if self.num_workers:
            lines.append(
                f"{self.num_workers} workers, {100 * self.worker_utilisation:.0f}% busy; "
                f"{self.bytes_in_flight / 2**20:.1f} MiB in flight"
            )
        if self.slowest_batches:
            seconds, what = self.slowest_batches[0]
            lines.append(f"slowest batch: {1000 * seconds:.2f} ms ({what})")
        for seconds, what in self.slowest_samples[:3]:
            lines.append(f"slow sample: {1000 * seconds:.2f} ms (index {what!r})")
        if self.memory:
            lines.append(
                "memory (unique / proportional MiB): "
                + ", ".join(
                    f"{who} {m.uss / 2**20:.0f} / {m.pss / 2**20:.0f}"
                    for who, m in self.memory.items()
                )
            )
        for node, figures in self.nodes.items():
            lines.append(figures.describe(f"{node}, {figures.actors} actor(s)", self.wall_s))
        for name, figures in self.actors.items():
            who = f"  actor {name} (worker {figures.worker_id})"
            lines.append(figures.describe(who, self.wall_s))
        lines += [f"autotune: {decision}" for decision in self.autotune]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


class StatsRecorder:
    """The loader's running totals; the engine adds to them, ``snapshot()`` reads them."""

    __slots__ = ("_first", "_last", "_slow_batches", "_slow_samples", "stats")

    def __init__(self, num_workers: int) -> None:
        self.stats = LoaderStats(num_workers=num_workers)
        self._first = 0.0
        self._last = 0.0
        self._slow_batches: list[tuple[float, int, Any]] = []
        self._slow_samples: list[tuple[float, int, Any]] = []

    def note(self, text: str) -> bool:
        """Records a note for ``stats()`` (see LoaderStats.notes); False if it already was."""
        if text in self.stats.notes:
            return False
        self.stats.notes.append(text)
        return True

    def delivered(self, waited_s: float) -> None:
        """A batch reached the consumer, who waited ``waited_s`` in ``next()`` for it."""
        now = time.perf_counter()
        stats = self.stats
        if not stats.batches:
            self._first = now - waited_s
        self._last = now
        stats.batches += 1
        stats.wait_s += waited_s

    def loaded(
        self,
        worker_id: int | None,
        samples: int,
        fetch_s: float,
        collate_s: float,
        what: Any,
        slow: tuple[Any, ...] = (),
    ) -> None:
        """A batch of ``samples`` was fetched and collated by ``worker_id`` (None: the trainer)."""
        stats = self.stats
        stats.samples += samples
        stats.fetch_s += fetch_s
        stats.collate_s += collate_s
        busy = fetch_s + collate_s
        if worker_id is not None:
            stats.worker_busy_s[worker_id] = stats.worker_busy_s.get(worker_id, 0.0) + busy
        heap = self._slow_batches
        if len(heap) < _KEEP_SLOWEST or busy > heap[0][0]:  # most batches stop here
            _keep(heap, busy, what)
        for seconds, index in slow:
            _keep(self._slow_samples, seconds, index)

    def actor_loaded(
        self,
        actor: str,
        worker_id: int,
        node: str,
        samples: int,
        nbytes: int,
        busy_s: float,
        transfer_s: float,
    ) -> None:
        """A Ray actor's batch reached the trainer (``worker_mode="ray"``)."""
        figures = self.stats.actors.get(actor)
        if figures is None:
            figures = self.stats.actors[actor] = ActorStats(node=node, worker_id=worker_id)
        figures.batches += 1
        figures.samples += samples
        figures.bytes += nbytes
        figures.busy_s += busy_s
        figures.transfer_s += transfer_s

    def snapshot(
        self,
        bytes_in_flight: int = 0,
        autotune: list[str] | None = None,
        pids: dict[int, int] | None = None,
    ) -> LoaderStats:
        stats = self.stats
        out = LoaderStats(**{k: getattr(stats, k) for k in stats.__dataclass_fields__})
        out.worker_busy_s = dict(stats.worker_busy_s)
        out.notes = list(stats.notes)
        out.actors = {name: dataclasses.replace(a) for name, a in stats.actors.items()}
        out.wall_s = self._last - self._first if stats.batches else 0.0
        out.bytes_in_flight = bytes_in_flight
        out.autotune = list(autotune or [])
        for who, pid in [
            ("trainer", os.getpid()),
            *((f"worker {w}", p) for w, p in sorted((pids or {}).items())),
        ]:
            memory = process_memory(pid)
            if memory is not None:
                out.memory[who] = memory
        out.slowest_batches = [(s, w) for s, _, w in sorted(self._slow_batches, reverse=True)]
        out.slowest_samples = [(s, w) for s, _, w in sorted(self._slow_samples, reverse=True)]
        return out


_tiebreak = iter(range(1 << 62))


def _keep(heap: list[tuple[float, int, Any]], seconds: float, what: Any) -> None:
    item = (seconds, next(_tiebreak), what)
    if len(heap) < _KEEP_SLOWEST:
        heapq.heappush(heap, item)
    elif seconds > heap[0][0]:
        heapq.heapreplace(heap, item)
