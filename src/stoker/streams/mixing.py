"""Weighted mixing of datasets: :func:`mix` and :class:`Mix`.

The sources are interleaved by a deterministic schedule, not by random draws: at every
step each active source's *credit* grows by its weight (weights are normalised to sum to
1) and the source with the most credit is drawn, its credit falling by 1 (a smooth
weighted round-robin). So proportions are exact over short spans, not just on average:

* after any ``n`` draws, source ``i`` has been drawn ``c_i`` times with
  ``|c_i - n * w_i| < 1``;
* hence in every window of ``W`` consecutive draws it is drawn ``W * w_i`` times
  give or take less than 2, and with two sources less than 1 (each window count is
  ``floor(W * w_i)`` or ``ceil(W * w_i)``).

``seed`` only breaks ties (which of equally credited sources goes first), differently
each epoch; the bounds hold for every seed.

When a source runs out (``on_exhausted``):

* ``"stop"`` (default): the mix ends there;
* ``"restart"``: that source starts over (``iter()`` again) and the mix goes on until
  every source has run out at least once (small sources are oversampled to keep their
  weight);
* ``"drop"``: that source leaves the mix, the weights of the others are normalised again
  and their schedule starts afresh (the bounds hold within each such phase); the mix ends
  when every source has run out.

Map-style sources (``__getitem__`` and ``__len__``) are read in index order, or in the
order of the ``sampler`` given with them as a ``(dataset, sampler)`` pair. Iterable
sources shard themselves over ranks and workers (stoker's readers do); a map-style
source is split by index position: the shard ``s`` of ``S`` (rank x worker) reads the
positions ``s, s + S, ...``. So with workers each worker mixes its own shard of every
source, and the proportions hold for each worker's output. The rank comes from
``rank=`` / ``world_size=``, else from the sources that were given one (stoker's readers
take them), else from ``torch.distributed`` or ``RANK`` / ``WORLD_SIZE`` (see
:mod:`stoker.sharding`).

``state_dict()`` holds the schedule (its step and credits) and each source's position:
an iterable source's own ``state_dict()`` (stoker's readers and :class:`ShuffleBuffer`
have one), a map-style source's count of samples read. Loading it resumes exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._state_capture import capture, captured, holds_state
from stoker._validate import check_choice, check_int, check_optional_int
from stoker.datasets import IterableDataset, is_iterable_dataset
from stoker.seeding import epoch_rng
from stoker.sharding import current_shard
from stoker.streams._records import check_stream_state

__all__ = ["Mix", "mix"]

_ON_EXHAUSTED = ("stop", "restart", "drop")
_KIND = "stoker.mix"
_END = object()


class _Schedule:
    """The smooth weighted round-robin over the active sources."""

    def __init__(self, weights: Sequence[float], ties: list[int]) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        self.active = [True] * len(weights)
        self.credit = [0.0] * len(weights)
        self.ties = ties  # tie-break rank of each source (lower goes first)
        self.step = 0
        self._normalise()

    def _normalise(self) -> None:
        total = float(sum(w for w, a in zip(self.weights, self.active, strict=True) if a))
        self.share = [
            float(w) / total if a else 0.0 for w, a in zip(self.weights, self.active, strict=True)
        ]

    def next(self) -> int:
        best = -1
        for i, share in enumerate(self.share):
            if not self.active[i]:
                continue
            self.credit[i] += share
            if best < 0 or (self.credit[i], -self.ties[i]) > (self.credit[best], -self.ties[best]):
                best = i
        self.credit[best] -= 1.0
        self.step += 1
        return best

    def drop(self, i: int) -> None:
        self.active[i] = False
        self.credit = [0.0] * len(self.credit)
        self._normalise()


def _topology(
    datasets: Sequence[Any], rank: int | None, world_size: int | None
) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` of a mix: as given, else the sources' own, else ``None`` (found)."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            msg = f"pass both rank and world_size to mix, or neither; got {rank=}, {world_size=}"
            raise ValueError(msg)
        return check_int("rank", rank), check_int("world_size", world_size, minimum=1)
    given = {
        (d.rank, d.world_size)
        for d in datasets
        if getattr(d, "rank", None) is not None and getattr(d, "world_size", None) is not None
    }
    if len(given) > 1:
        named = ", ".join(f"rank={r} of world_size={w}" for r, w in sorted(given))
        msg = f"the sources of mix were given different ranks ({named}); give them one rank"
        raise ValueError(msg)
    return given.pop() if given else (None, None)


def _is_stream(dataset: Any) -> bool:
    """An iterable source (read with iter()), not a map-style one (read by index)."""
    return is_iterable_dataset(dataset) or not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    )


class _Source:
    """One source as the mix reads it: an iterator and a way to save and restore its place."""

    def __init__(self, dataset: Any, sampler: Any, shard: tuple[int, int]) -> None:
        self.dataset, self.sampler, self.shard = dataset, sampler, shard
        self.iterable = _is_stream(dataset)
        self.taken = 0
        self.iterator: Iterator[Any] | None = None

    def _indices(self) -> list[Any]:
        order = list(self.sampler) if self.sampler is not None else range(len(self.dataset))
        index, count = self.shard
        return list(order[index::count])

    def start(self, state: Any = None) -> None:
        if self.iterable:
            if state is not None:
                self.dataset.load_state_dict(state)
            self.iterator = iter(self.dataset)
            return
        self.taken = 0 if state is None else int(state)
        indices = self._indices()[self.taken :]
        self.iterator = (self.dataset[i] for i in indices)

    def next(self) -> Any:
        assert self.iterator is not None
        value = next(self.iterator, _END)
        if value is not _END:
            self.taken += 1
        return value

    def capture(self) -> Any:
        """A cheap capture of this source's place (see stoker._state_capture)."""
        if not self.iterable:
            return self.taken
        if not holds_state(self.dataset):
            msg = (
                f"Mix cannot save a mid-epoch state: its source {type(self.dataset).__name__} "
                "has no state_dict / load_state_dict. Use stoker's readers or give it those "
                "methods."
            )
            raise TypeError(msg)
        return capture(self.dataset)

    def captured(self, snapshot: Any) -> Any:
        return captured(self.dataset, snapshot) if self.iterable else snapshot


class _Running:
    """A mix's live iteration: its schedule, its sources, which ran out, whether it ended."""

    __slots__ = ("ended", "ran_out", "schedule", "sources")

    def __init__(self, schedule: _Schedule, sources: list[_Source], ran_out: list[bool]) -> None:
        self.schedule, self.sources, self.ran_out, self.ended = schedule, sources, ran_out, False


class Mix(IterableDataset[Any]):
    """Interleaves datasets in fixed proportions, deterministically and resumably.

    Build it with :func:`mix`; see the module docs for the schedule's bounds, the
    exhaustion policies, workers and resuming.

    Example:
        >>> mixed = Mix([["a"] * 6, ["b"] * 6], weights=[2, 1])
        >>> "".join(mixed)
        'abaabaaba'
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        seed: int | None = None,
        on_exhausted: str = "stop",
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        sources = list(datasets)
        if not sources:
            raise ValueError("Mix needs at least one dataset")
        weights = [1.0] * len(sources) if weights is None else [float(w) for w in weights]
        if len(weights) != len(sources) or any(
            not w > 0 or w != w or w == float("inf") for w in weights
        ):
            msg = (
                f"weights must be one positive, finite number per dataset ({len(sources)}), "
                f"got {weights!r}"
            )
            raise ValueError(msg)
        self.datasets: list[Any] = []
        self.samplers: list[Any] = []
        for source in sources:
            dataset, sampler = source if isinstance(source, tuple) else (source, None)
            self.datasets.append(dataset)
            self.samplers.append(sampler)
        self.weights = weights
        self.seed = check_optional_int("seed", seed)
        self.on_exhausted = check_choice("on_exhausted", on_exhausted, _ON_EXHAUSTED)
        self.rank, self.world_size = _topology(self.datasets, rank, world_size)
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        self._live: _Running | None = None

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch, and passes it to every source (and sampler) that takes one."""
        self.epoch = check_int("epoch", epoch)
        for part in (*self.datasets, *self.samplers):
            set_epoch = getattr(part, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def _ties(self) -> list[int]:
        if self.seed is None:
            return list(range(len(self.datasets)))
        return epoch_rng(self.seed, self.epoch).permutation(len(self.datasets)).tolist()

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        shard = current_shard(rank=self.rank, world_size=self.world_size)
        schedule = _Schedule(self.weights, self._ties())
        sources = [_Source(d, s, shard) for d, s in zip(self.datasets, self.samplers, strict=True)]
        ran_out = [False] * len(sources)
        if resume is not None:
            if list(resume["shard"]) != list(shard):
                msg = (
                    f"Mix: this state was saved by shard {resume['shard']} (rank x worker) and is "
                    f"loaded in shard {list(shard)}; resume with the same ranks and workers"
                )
                raise ValueError(msg)
            schedule.step = int(resume["step"])
            schedule.credit = [float(c) for c in resume["credit"]]
            schedule.active = [bool(a) for a in resume["active"]]
            schedule._normalise()
            ran_out = [bool(r) for r in resume["ran_out"]]
        for i, source in enumerate(sources):
            source.start(None if resume is None else resume["sources"][i])
        live = self._live = _Running(schedule, sources, ran_out)
        return self._draws(live)

    def _draws(self, live: _Running) -> Iterator[Any]:
        try:
            yield from self._drawn(live.schedule, live.sources, live.ran_out)
        finally:
            live.ended = True

    def _drawn(
        self, schedule: _Schedule, sources: list[_Source], ran_out: list[bool]
    ) -> Iterator[Any]:
        while any(schedule.active):
            i = schedule.next()
            value = sources[i].next()
            while value is _END:
                ran_out[i] = True
                if self.on_exhausted == "stop" or (self.on_exhausted == "restart" and all(ran_out)):
                    return
                if self.on_exhausted == "restart":
                    sources[i].start()
                    value = sources[i].next()
                    if value is _END:
                        msg = f"Mix: source {i} ({type(sources[i].dataset).__name__}) is empty"
                        raise ValueError(msg)
                    break
                schedule.drop(i)  # "drop"
                if not any(schedule.active):
                    return
                i = schedule.next()
                value = sources[i].next()
            yield value

    def state_dict(self) -> dict[str, Any]:
        """The schedule's place and each source's position, to resume exactly."""
        if self._live is None:
            if self._resume is not None:
                return dict(self._resume)
            msg = "Mix.state_dict() describes a running iteration; start iterating first"
            raise ValueError(msg)
        return self._captured_state(self._snapshot(self._live))

    # -- cheap captures (stoker._state_capture) ------------------------------------------
    def _saves_state(self) -> bool:
        return all(not _is_stream(d) or holds_state(d) for d in self.datasets)

    def _snapshot(self, live: _Running) -> tuple[Any, ...]:
        schedule, sources = live.schedule, live.sources
        return (
            self.epoch, list(sources[0].shard), schedule.step, list(schedule.credit),
            list(schedule.active), list(live.ran_out), [(s, s.capture()) for s in sources],
        )  # fmt: skip

    def _capture_state(self) -> Any:
        """The schedule's place and each source's capture; None between iterations."""
        live = self._live
        return None if live is None or live.ended else self._snapshot(live)

    def _captured_state(self, snapshot: Any) -> dict[str, Any] | None:
        if snapshot is None:
            return None
        epoch, shard, step, credit, active, ran_out, sources = snapshot
        return {
            "kind": _KIND, "epoch": epoch, "shard": shard, "step": step, "credit": credit,
            "active": active, "ran_out": ran_out,
            "sources": [source.captured(c) for source, c in sources],
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue where ``state`` (from :meth:`state_dict`) stood."""
        state = check_stream_state("Mix", state, _KIND)
        self.set_epoch(int(state["epoch"]))
        self._resume = state

    def __repr__(self) -> str:
        names = ", ".join(type(d).__name__ for d in self.datasets)
        return f"Mix([{names}], weights={self.weights}, on_exhausted={self.on_exhausted!r})"


def mix(
    datasets: Sequence[Any],
    weights: Sequence[float] | None = None,
    *,
    seed: int | None = None,
    on_exhausted: str = "stop",
    rank: int | None = None,
    world_size: int | None = None,
) -> Mix:
    """Interleaves ``datasets`` in the proportions ``weights`` (see :class:`Mix`).

    Args:
        datasets: iterable datasets, map-style datasets, or ``(map_dataset, sampler)``
            pairs (the sampler gives the order of the indices).
        weights: one positive number per dataset (normalised); default equal weights.
        seed: decides which of equally credited sources is drawn first, per epoch.
        on_exhausted: ``"stop"``, ``"restart"`` or ``"drop"`` (see the module docs).
        rank, world_size: the rank splitting the map-style sources; ``None`` takes the
            sources' own (stoker's readers), else the distributed environment.

    Example:
        >>> "".join(mix([["a"] * 3, ["b"] * 3]))
        'ababab'
    """
    return Mix(
        datasets, weights, seed=seed, on_exhausted=on_exhausted, rank=rank, world_size=world_size
    )
