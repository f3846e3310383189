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
:mod:`stoker.sharding`). A mix given a rank (or finding one in its sources) passes it to
every iterable source that takes one (has ``rank`` and ``world_size`` attributes, looked
for through :class:`~stoker.streams.ShuffleBuffer`, :class:`~stoker.streams.BucketStream`,
``ChainDataset`` and nested mixes) and has none; a source of another rank, or one that
cannot take a rank while ``world_size > 1``, is refused.

Samplers: every worker computes a sampler's whole order and reads its positions of it, so
the order must be the same in every worker, and it is computed from a copy of the sampler
(the sampler itself is not advanced, so thread workers can share it). For epoch ``e`` and
the ``p``-th restart of its source (``"restart"``):

* stoker's samplers give their order of epoch ``e + p``: with their own seed (``generator=``
  an int or a numpy Generator) that is their usual order; built with ``generator=None``,
  inside a loader they are seeded from the loader's epoch seed and the source's place in
  the mix (so ``DataLoader(generator=...)`` decides the order, the same in every worker,
  and ``num_workers=0`` gives the order of ``num_workers=1``), outside a loader from their
  own seed, drawn once;
* torch's samplers (``torch.utils.data.RandomSampler`` and the others with a ``generator``
  attribute) built with ``generator=None``: inside a loader they get a ``torch.Generator``
  seeded from the loader's epoch seed, the source's place, ``e`` and ``p``; outside a loader
  they are iterated as they are (one process: their own draw);
* a sampler with its own ``torch.Generator`` (stoker's or torch's): one seed is drawn from a
  copy of that generator (which does not advance), and each ``(e, p)`` is drawn from it;
* any other sampler is iterated as it is: its order must not depend on the worker.

``state_dict()`` holds the schedule (its step and credits) and each source's position:
an iterable source's own ``state_dict()`` (stoker's readers and :class:`ShuffleBuffer`
have one), a map-style source's count of samples read and of restarts. Loading it resumes
exactly; a damaged or edited state raises a ``ValueError`` naming the entry.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from stoker._state_capture import CapturesState, capture, captured, holds_state
from stoker._validate import check_choice, check_int, check_optional_int, is_number
from stoker.datasets import IterableDataset, is_iterable_dataset
from stoker.engine.random_scopes import _MASK64, SAMPLE, _mix, current_scope
from stoker.samplers._base import EpochState
from stoker.seeding import _DRAWN_SEED_BOUND, _derive_rng, _is_torch_generator, epoch_rng
from stoker.sharding import _any_worker_info, current_shard
from stoker.streams._records import (
    check_stream_state,
    damaged,
    state_error,
    state_int,
    state_list,
    state_shard,
)

__all__ = ["Mix", "mix"]

_ON_EXHAUSTED = ("stop", "restart", "drop")
_KIND = "stoker.mix"
_STATE_KEYS = ("kind", "epoch", "shard", "step", "credit", "active", "ran_out", "sources")
_CREDIT_SLACK = 1e-6  # rounding a schedule's credits may gather over many steps
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


def _is_stream(dataset: Any) -> bool:
    """Iterable (read by iterating), not map-style (split by the mix by index position)."""
    return is_iterable_dataset(dataset) or not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    )


def _ranked_parts(source: Any) -> tuple[list[Any], list[Any]]:
    """The parts of an iterable source that take a rank, and those that cannot take one.

    A part takes one when it has ``rank`` and ``world_size`` attributes (stoker's readers,
    ``ShardedIterable``, a mix); wrappers are looked through (``dataset``: ShuffleBuffer,
    BucketStream; ``datasets``: ChainDataset, and a mix's iterable sources).
    """
    ranked: list[Any] = []
    blind: list[Any] = []
    pending = [source] if _is_stream(source) else []
    while pending:
        part = pending.pop()
        takes = hasattr(part, "rank") and hasattr(part, "world_size")
        if takes:
            ranked.append(part)
        if isinstance(part, Mix):
            pending.extend(d for d in part.datasets if _is_stream(d))
        elif not takes:
            inner = getattr(part, "datasets", None)
            inner = [part.dataset] if inner is None and hasattr(part, "dataset") else inner
            if inner:
                pending.extend(inner)
            else:
                blind.append(part)
    return ranked, blind


def _named(part: Any, source: Any) -> str:
    name = type(part).__name__
    return name if part is source else f"the {name} in {type(source).__name__}"


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
        (part.rank, part.world_size)
        for d in datasets
        for part in _ranked_parts(d)[0]
        if part.rank is not None and part.world_size is not None
    }
    if len(given) > 1:
        named = ", ".join(f"rank={r} of world_size={w}" for r, w in sorted(given))
        msg = f"the sources of mix were given different ranks ({named}); give them one rank"
        raise ValueError(msg)
    return given.pop() if given else (None, None)


def _give_topology(datasets: Sequence[Any], rank: int, world_size: int) -> None:
    """Passes the mix's rank to its iterable sources; refuses those it cannot reach."""
    ranked: list[Any] = []
    for i, source in enumerate(datasets):
        parts, blind = _ranked_parts(source)
        for part in parts:
            if part.rank not in (None, rank) or part.world_size not in (None, world_size):
                msg = (
                    f"mix has rank={rank} of world_size={world_size}, but its source {i} "
                    f"({_named(part, source)}) has rank={part.rank} of world_size="
                    f"{part.world_size}: give the sources the mix's rank, or give them none "
                    "(the mix passes its own to them)"
                )
                raise ValueError(msg)
        if blind and world_size > 1:
            msg = (
                f"mix has rank={rank} of world_size={world_size}, but its source {i} "
                f"({_named(blind[0], source)}) is an iterable dataset without rank and "
                "world_size attributes, so the mix cannot pass its rank to it and every rank "
                "would read all of it: give it rank and world_size attributes and split its "
                "records by them (stoker's readers and ShardedIterable take rank= and "
                "world_size=), or make it map-style"
            )
            raise ValueError(msg)
        ranked += parts
    for part in ranked:
        part.rank, part.world_size = rank, world_size


# -- samplers: one order in every worker -------------------------------------------------


def _loader_key() -> int | None:
    """A key of the loader's epoch that all its workers share; ``None`` outside a loader.

    A worker's seed is the loader's epoch seed plus the worker's id (stoker's loader and
    torch's alike), so each worker finds the epoch seed; the key is the base of the random
    scope that stoker's loader opens around a stream's ``iter()`` with that seed, which is
    what the main process finds with ``num_workers=0``. So 0 and 1 workers agree.
    """
    info = _any_worker_info()
    if info is not None:
        return _mix((int(info.seed) - int(info.id)) & _MASK64, SAMPLE)
    scope = current_scope()
    return None if scope is None else scope.base


def _is_torch_sampler(sampler: Any) -> bool:
    torch_data = sys.modules.get("torch.utils.data")
    return torch_data is not None and isinstance(sampler, torch_data.Sampler)


def _sampler_seed(sampler: Any, key: int | None, source: int) -> int | None:
    """The seed the mix gives ``sampler`` this epoch; ``None``: its own order is kept.

    See the module docs: the loader's key for a sampler without a generator, a seed drawn
    from a copy of its own torch.Generator, none for a sampler with its own int seed.
    """
    if not hasattr(sampler, "generator"):
        return None
    generator = sampler.generator
    if _is_torch_generator(generator):
        import torch

        twin = torch.Generator(device=generator.device)
        twin.set_state(generator.get_state())
        return int(_derive_rng(twin).integers(0, _DRAWN_SEED_BOUND))
    if generator is not None or key is None:
        return None
    return int(epoch_rng(key, 0, source).integers(0, _DRAWN_SEED_BOUND))


def _sampler_order(sampler: Any, seed: int | None, epoch: int) -> list[Any]:
    """The sampler's order for ``epoch`` (the mix's epoch plus the source's restarts)."""
    if isinstance(sampler, EpochState):
        if seed is None:
            sampler.base_seed  # noqa: B018 (one seed drawn once and kept, for every epoch)
        twin = copy.copy(sampler)
        if seed is not None:
            twin.generator = seed  # type: ignore[attr-defined]
        twin.set_epoch(epoch)
        return list(twin)
    if seed is not None and _is_torch_sampler(sampler):
        import torch

        twin = copy.copy(sampler)
        twin.generator = torch.Generator().manual_seed(
            int(epoch_rng(seed, epoch).integers(0, _DRAWN_SEED_BOUND))
        )
        return list(twin)
    return list(sampler)


class _Source:
    """One source as the mix reads it: an iterator and a way to save and restore its place."""

    def __init__(self, dataset: Any, sampler: Any, shard: tuple[int, int], seed: int | None):
        self.dataset, self.sampler, self.shard, self.seed = dataset, sampler, shard, seed
        self.iterable = _is_stream(dataset)
        self.taken = 0
        self.length = 0  # samples of this shard per pass (map-style)
        self.passes = 0  # how many times "restart" started it over this epoch
        self.iterator: Iterator[Any] | None = None

    def indices(self, epoch: int) -> list[Any]:
        """The positions of a map-style source this shard reads, in order."""
        if self.sampler is None:
            order: Any = range(len(self.dataset))
        else:
            order = _sampler_order(self.sampler, self.seed, epoch + self.passes)
        index, count = self.shard
        return list(order[index::count])

    def start(self, epoch: int, taken: int = 0) -> None:
        """Starts reading (a map-style source after ``taken`` samples of this pass)."""
        if self.iterable:  # a loaded state was loaded into the source itself
            self.iterator = iter(self.dataset)
            return
        indices = self.indices(epoch)
        self.length, self.taken = len(indices), taken
        self.iterator = (self.dataset[i] for i in indices[taken:])

    def next(self) -> Any:
        if self.iterator is None:
            raise AssertionError("_Source.next() before start()")
        value = next(self.iterator, _END)
        if value is not _END:
            self.taken += 1
        return value

    def capture(self) -> Any:
        """A cheap capture of this source's place (see stoker._state_capture)."""
        if not self.iterable:
            return (self.taken, self.passes)
        if not holds_state(self.dataset):
            msg = (
                f"Mix cannot save a mid-epoch state: its source {type(self.dataset).__name__} "
                "has no state_dict / load_state_dict. Use stoker's readers or give it those "
                "methods."
            )
            raise TypeError(msg)
        return capture(self.dataset)

    def captured(self, snapshot: Any) -> Any:
        """The state a capture stands for: a map-style source's ``{"taken", "passes"}``."""
        if self.iterable:
            return captured(self.dataset, snapshot)
        taken, passes = snapshot
        return {"taken": taken, "passes": passes}


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
        if self.rank is not None and self.world_size is not None:
            _give_topology(self.datasets, self.rank, self.world_size)
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
        key = _loader_key()
        sources = [
            _Source(d, s, shard, None if s is None else _sampler_seed(s, key, i))
            for i, (d, s) in enumerate(zip(self.datasets, self.samplers, strict=True))
        ]
        ran_out = [False] * len(sources)
        if resume is not None:
            if resume["shard"] != list(shard):
                msg = (
                    f"Mix: this state was saved by shard {resume['shard']} (rank x worker, "
                    f"state['shard']) and is loaded in shard {list(shard)}; resume with the "
                    "same ranks and workers"
                )
                raise ValueError(msg)
            schedule.step = resume["step"]
            schedule.credit = list(resume["credit"])
            schedule.active = list(resume["active"])
            schedule._normalise()
            ran_out = list(resume["ran_out"])
        for i, source in enumerate(sources):
            place = None if resume is None or source.iterable else resume["sources"][i]
            if place is None:
                source.start(self.epoch)
                continue
            source.passes = place["passes"]
            source.start(self.epoch, place["taken"])
            self._check_place(i, source, schedule.step)
        live = self._live = _Running(schedule, sources, ran_out)
        return self._draws(live)

    def _check_place(self, i: int, source: _Source, step: int) -> None:
        """A resumed map-style source's place fits this shard's part of it, and the draws."""
        entry = f"state['sources'][{i}]"
        if source.taken > source.length:
            msg = (
                f"Mix: {entry}['taken'] is {source.taken}, but this shard reads {source.length} "
                f"samples of source {i} ({type(source.dataset).__name__}); resume with the same "
                "datasets and samplers the state was saved with"
            )
            raise ValueError(msg)
        if source.passes * source.length + source.taken > step:
            place = {"taken": source.taken, "passes": source.passes}
            msg = (
                f"Mix: {entry} is {place}: more samples of source {i} ({source.length} a pass) "
                f"than the {step} draws of state['step'] can have read ({damaged('Mix')})"
            )
            raise ValueError(msg)

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
                    sources[i].passes += 1
                    sources[i].start(self.epoch)
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
        """Makes the next iteration continue where ``state`` (from :meth:`state_dict`) stood.

        The iterable sources load their parts of it here too.

        Raises:
            ValueError: ``state`` is not a state of this mix, or it was damaged or edited
                (the message names the entry and its value). What needs the shard is
                checked when the iteration starts.
        """
        state = self._checked_state(state)
        self.set_epoch(state["epoch"])
        for i, dataset in enumerate(self.datasets):
            if _is_stream(dataset) and state["sources"][i] is not None:  # None: it had ended
                try:
                    dataset.load_state_dict(state["sources"][i])
                except ValueError as exc:
                    msg = f"Mix.load_state_dict: state['sources'][{i}]: {exc}"
                    raise ValueError(msg) from exc
        self._resume = state

    def _checked_state(self, state: Any) -> dict[str, Any]:
        """``state`` with every entry checked that can be without the shard."""
        state = check_stream_state("Mix", state, _KIND, _STATE_KEYS)
        n = len(self.datasets)
        state["epoch"] = state_int("Mix", "state['epoch']", state["epoch"])
        state["shard"] = state_shard("Mix", state["shard"])
        state["step"] = state_int("Mix", "state['step']", state["step"])
        for key in ("credit", "active", "ran_out", "sources"):
            state[key] = state_list("Mix", f"state[{key!r}]", state[key], n)
        for key in ("active", "ran_out"):
            for i, flag in enumerate(state[key]):
                if not isinstance(flag, (bool, np.bool_)):
                    raise state_error("Mix", f"state[{key!r}][{i}]", flag, "True or False")
            state[key] = [bool(flag) for flag in state[key]]
        for i, (active, ran_out) in enumerate(zip(state["active"], state["ran_out"], strict=True)):
            if not active and (self.on_exhausted != "drop" or not ran_out):
                must = (
                    "True: a source leaves the mix only when it runs out under "
                    f"on_exhausted='drop' (this mix: {self.on_exhausted!r}, state['ran_out'][{i}] "
                    f"is {ran_out})"
                )
                raise state_error("Mix", f"state['active'][{i}]", active, must)
        state["credit"] = self._checked_credit(state["credit"], state["active"])
        for i, dataset in enumerate(self.datasets):
            place = state["sources"][i]
            if not _is_stream(dataset):
                state["sources"][i] = self._checked_place(i, place, state["ran_out"])
                continue
            if not state["ran_out"][i] and isinstance(dataset, CapturesState):
                self._check_running_source(i, dataset, place, state["epoch"])
            for key in ("epoch", "shard"):  # a stream saved with the mix shares both
                saved = place.get(key, state[key]) if isinstance(place, Mapping) else state[key]
                if saved is None:  # a source that ran out: an epoch's start (checked by it)
                    continue
                if (list(saved) if isinstance(saved, (tuple, np.ndarray)) else saved) != state[key]:
                    must = f"{state[key]!r}, the mix's state[{key!r}]"
                    raise state_error("Mix", f"state['sources'][{i}][{key!r}]", saved, must)
        return state

    def _check_running_source(self, i: int, dataset: Any, place: Any, epoch: int) -> None:
        """A stoker stream that had not run out has a state of its running iteration: no
        state (None) or an epoch's start (epoch None) would read it again from its start."""
        if place is None:
            must = (
                f"the state of its {type(dataset).__name__}: None only once it ran out "
                f"(state['ran_out'][{i}] is False)"
            )
            raise state_error("Mix", f"state['sources'][{i}]", place, must)
        if isinstance(place, Mapping) and "epoch" in place and place["epoch"] is None:
            must = (
                f"{epoch!r}, the mix's state['epoch']: None (an epoch's start) only once it ran "
                f"out (state['ran_out'][{i}] is False)"
            )
            raise state_error("Mix", f"state['sources'][{i}]['epoch']", None, must)

    def _checked_credit(self, credit: list[Any], active: list[bool]) -> list[float]:
        """Credits of the smooth round-robin: each in (-1, 1), 0 once dropped, summing to 0."""
        for i, (c, on) in enumerate(zip(credit, active, strict=True)):
            if not is_number(c) or not abs(c) < 1 + _CREDIT_SLACK or (not on and c != 0):
                must = "a number in (-1, 1)" if on else "0 (the source left the mix)"
                raise state_error("Mix", f"state['credit'][{i}]", c, must)
        if abs(math.fsum(credit)) > _CREDIT_SLACK:
            raise state_error("Mix", "state['credit']", credit, "credits that sum to 0")
        return [float(c) for c in credit]

    def _checked_place(self, i: int, place: Any, ran_out: list[bool]) -> dict[str, int]:
        """A map-style source's place: samples taken this pass, and its restarts."""
        entry = f"state['sources'][{i}]"
        if not isinstance(place, Mapping) or set(place) != {"taken", "passes"}:
            raise state_error("Mix", entry, place, "{'taken': int, 'passes': int}")
        sampler, dataset = self.samplers[i], self.datasets[i]
        sized = sampler if sampler is not None and hasattr(sampler, "__len__") else dataset
        taken = state_int("Mix", f"{entry}['taken']", place["taken"], maximum=len(sized))
        passes = state_int("Mix", f"{entry}['passes']", place["passes"])
        if passes and (self.on_exhausted != "restart" or not ran_out[i]):
            must = (
                "0: only a source that ran out is restarted, under on_exhausted='restart' "
                f"(this mix: {self.on_exhausted!r}, state['ran_out'][{i}] is {ran_out[i]})"
            )
            raise state_error("Mix", f"{entry}['passes']", passes, must)
        return {"taken": taken, "passes": passes}

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
