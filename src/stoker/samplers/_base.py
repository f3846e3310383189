"""The sampler base class and the epoch / seed / state logic every stoker sampler shares.

Epochs
    Every stoker sampler keeps an epoch counter. ``iter(sampler)`` uses the current
    epoch and then advances the counter by one, so iterating twice gives two different
    epochs without calling anything; ``set_epoch(e)`` (or ``sampler.epoch = e``) sets
    the epoch that the *next* ``iter()`` uses, so a loop that calls ``set_epoch(e)``
    before every epoch gets exactly epoch ``e``. The epoch is taken, and the random
    numbers are drawn, when ``iter()`` is called, not when the first index is read.

Randomness
    ``generator=`` follows :mod:`stoker.seeding`: with ``None``, an ``int`` or a
    ``numpy.random.Generator`` a base seed is fixed at construction and the order of
    epoch ``e`` is a pure function of ``(base_seed, e)``. With a ``torch.Generator``
    the samplers that torch also has run torch's own algorithm on that generator
    (value for value equal to ``torch.utils.data``); the others draw one seed from it
    per epoch.

State
    ``state_dict()`` is a small dict (the sampler's type, the epoch, the base seed or
    the torch generator's state), never a list of indices; ``load_state_dict`` puts a
    sampler built with any ``generator=`` back into that state.

The fast-path protocol
    An index sampler whose ``__iter__`` is :meth:`IndexSampler.__iter__` implements
    ``_epoch_indices() -> numpy.ndarray`` (1-D, int64): the whole epoch's indices,
    taking and advancing the epoch exactly as ``iter()`` would. A
    :class:`~stoker.samplers.BatchSampler` over such a sampler slices that array
    instead of pulling one Python int at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from stoker._validate import check_int, is_int
from stoker.seeding import _derive_rng, _is_torch_generator, _resolve_base_seed, epoch_rng

__all__ = [
    "EpochState",
    "IndexSampler",
    "Randomized",
    "Sampler",
    "as_int_array",
    "iter_ints",
]

T_co = TypeVar("T_co", covariant=True)

# Indices are turned into Python ints this many at a time, so an epoch of 10^8 indices
# never materialises 10^8 int objects at once.
_TOLIST_CHUNK = 8192


class Sampler(Generic[T_co]):
    """Base class of samplers: an iterable of dataset indices (or of index batches).

    Like ``torch.utils.data.Sampler``: subclasses implement ``__iter__`` and may
    implement ``__len__`` (there is deliberately no default ``__len__``, so ``len()``
    of a sampler without one raises ``TypeError``).

    Example:
        >>> class EvenSampler(Sampler[int]):
        ...     def __init__(self, n):
        ...         self.n = n
        ...     def __iter__(self):
        ...         return iter(range(0, self.n, 2))
        >>> list(EvenSampler(7))
        [0, 2, 4, 6]
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


def as_int_array(name: str, values: Any, *, non_negative: bool) -> np.ndarray:
    """``values`` (a 1-D sequence or array of ints) as an int64 array.

    Raises:
        ValueError: ``values`` is not 1-D, or (with ``non_negative``) holds a negative
            int; the message names the first bad position.
        TypeError: an element is not an int; the message names the first one.
    """
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nesting
        arr = np.asarray(values, dtype=object)
    if arr.ndim != 1:
        msg = f"{name} must be a 1-D sequence of ints, got an array of shape {arr.shape}"
        raise ValueError(msg)
    if isinstance(values, (list, tuple)):
        # Check the elements as given: numpy would turn True into 1, or [1, 2.5] into floats.
        elements: Any = values
    elif arr.dtype.kind in "iu" or arr.size == 0:
        elements = ()
    else:
        elements = arr.tolist()
    for i, value in enumerate(elements):
        if not is_int(value):
            msg = f"{name} must be ints, but {name}[{i}] is {type(value).__name__}: {value!r}"
            raise TypeError(msg)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    arr = arr.astype(np.int64)
    if non_negative:
        negative = np.flatnonzero(arr < 0)
        if negative.size:
            i = int(negative[0])
            msg = f"{name} must be non-negative, but {name}[{i}] is {int(arr[i])}"
            raise ValueError(msg)
    return arr


def iter_ints(indices: np.ndarray) -> Iterator[int]:
    """Yields the elements of an integer array as Python ints, a chunk at a time."""
    for start in range(0, len(indices), _TOLIST_CHUNK):
        yield from indices[start : start + _TOLIST_CHUNK].tolist()


class EpochState:
    """Mixin: the epoch counter, the resolved generator and ``state_dict``.

    Subclasses call :meth:`_init_epoch_state` from ``__init__``. ``seeded=False`` is for
    samplers without randomness (their state is the epoch alone).
    """

    _epoch: int
    _base_seed: int | None
    _torch_generator: Any
    _generator: Any
    _seeded: bool

    def _init_epoch_state(self, generator: Any, *, seeded: bool = True) -> None:
        self._epoch = 0
        self._seeded = seeded
        self._use_generator(generator)

    def _use_generator(self, generator: Any) -> None:
        self._generator = generator
        self._base_seed = None
        self._torch_generator = None
        if not self._seeded:
            return
        if _is_torch_generator(generator):
            self._torch_generator = generator
        elif generator is not None:
            self._base_seed = _resolve_base_seed(generator)
        # generator=None: the seed is drawn when first needed (the first epoch), so
        # building a sampler leaves the global random generators as it found them

    def _fresh_seed(self) -> int:
        """The base seed of a sampler built with ``generator=None`` (numpy's global RNG)."""
        return _resolve_base_seed(None)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` uses (it advances by one at every ``iter()``)."""
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch = check_int("epoch", epoch)

    @property
    def base_seed(self) -> int | None:
        """The base seed epochs derive from; ``None`` for a torch.Generator or no randomness."""
        return self._seed_now()

    def _seed_now(self) -> int | None:
        """The base seed, drawn now for a sampler built with ``generator=None``."""
        if self._base_seed is None and self._seeded and self._torch_generator is None:
            self._base_seed = self._fresh_seed()
        return self._base_seed

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that the next ``iter()`` uses.

        Args:
            epoch: a non-negative int. With an int seed or numpy Generator, epoch
                ``e``'s order depends only on the base seed and ``e``.
        """
        self._epoch = check_int("epoch", epoch)

    def _next_epoch(self) -> int:
        epoch = self._epoch
        self._epoch = epoch + 1
        return epoch

    def _rng(self, epoch: int) -> np.random.Generator:
        """The numpy Generator of ``epoch`` (one seed drawn from a torch.Generator)."""
        if self._torch_generator is not None:
            return _derive_rng(self._torch_generator)
        seed = self._seed_now()
        if seed is None:
            msg = f"{type(self).__name__} has no randomness, yet a random generator was requested"
            raise AssertionError(msg)
        return epoch_rng(seed, epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small dict from which :meth:`load_state_dict` restores the sampler.

        Holds ``type`` (the class name), ``epoch`` (the next epoch), and either
        ``seed`` (the base seed) or ``generator_state`` (the torch.Generator's
        ``get_state()``); never a list of indices.
        """
        state: dict[str, Any] = {"type": type(self).__name__, "epoch": self._epoch}
        if self._torch_generator is not None:
            state["generator_state"] = self._torch_generator.get_state()
        elif self._seed_now() is not None:
            state["seed"] = self._base_seed
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores the epoch and the randomness saved by :meth:`state_dict`.

        Loading a ``seed`` replaces this sampler's base seed (so a sampler built with
        ``generator=None`` replays the saved run); loading a ``generator_state`` sets
        the state of the torch.Generator this sampler was built with.

        Raises:
            ValueError: the dict was saved by another kind of sampler, or by one built
                with another kind of generator.
        """
        name = type(self).__name__
        if not isinstance(state_dict, Mapping) or "epoch" not in state_dict:
            msg = (
                f"{name}.load_state_dict expects the dict returned by state_dict(), "
                f"got {type(state_dict).__name__}: {state_dict!r}"
            )
            raise ValueError(msg)
        saved_type = state_dict.get("type", name)
        if saved_type != name:
            msg = f"this state was saved by a {saved_type}; it cannot be loaded into a {name}"
            raise ValueError(msg)
        epoch = check_int("epoch", state_dict["epoch"])
        if self._torch_generator is not None:
            if "generator_state" not in state_dict:
                msg = (
                    f"this {name} draws from a torch.Generator, but the state has no "
                    "'generator_state' (it was saved by a sampler built with an int seed, "
                    "a numpy Generator or None); build the sampler the same way it was saved"
                )
                raise ValueError(msg)
            self._torch_generator.set_state(state_dict["generator_state"])
        elif self._seeded or self._base_seed is not None:
            if "seed" not in state_dict:
                msg = (
                    f"this {name} uses an int seed, but the state has no 'seed' (it was saved "
                    "by a sampler built with a torch.Generator); build the sampler the same "
                    "way it was saved"
                )
                raise ValueError(msg)
            self._base_seed = _resolve_base_seed(state_dict["seed"], argument="state_dict['seed']")
        self._epoch = epoch


class Randomized:
    """Mixin of the samplers that take ``generator=``: the ``generator`` attribute."""

    _generator: Any

    @property
    def generator(self) -> Any:
        """The ``generator=`` the sampler was built with, or the one assigned since.

        Assigning a new one (as some training frameworks do, to share one
        torch.Generator between processes) takes effect from the next epoch; the epoch
        counter is kept.
        """
        return self._generator

    @generator.setter
    def generator(self, generator: Any) -> None:
        self._use_generator(generator)  # type: ignore[attr-defined]


class IndexSampler(EpochState, Sampler[int]):
    """Base of stoker's samplers of single indices.

    Subclasses implement ``_indices_for_epoch(epoch) -> np.ndarray`` (1-D int64);
    ``__iter__`` and ``_epoch_indices`` are defined here in terms of it.
    """

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement _indices_for_epoch")

    def _epoch_indices(self) -> np.ndarray:
        """The indices of the next epoch as a 1-D int64 array; advances the epoch.

        This is what ``iter()`` yields, so the two must not both be called for the
        same epoch.
        """
        indices = self._indices_for_epoch(self._next_epoch())
        if indices.dtype != np.int64 or indices.ndim != 1:
            msg = f"{type(self).__name__} produced {indices.dtype} indices of shape {indices.shape}"
            raise AssertionError(msg)
        return indices

    def __iter__(self) -> Iterator[int]:
        return iter_ints(self._epoch_indices())
