"""Per-sample random scopes: how global random draws become worker-independent.

The user's side of this story (what is seeded, and what ``worker_init_fn`` changes) is in
:mod:`stoker.seeding`; this module is the machinery behind it, and only the engine and
:func:`stoker.seeding.sample_rng` use it.

The fetchers (``fetch.py``) open a scope around every sample (:data:`SAMPLE`), every
``__getitems__`` call (:data:`BATCH`) and every ``collate_fn`` call (:data:`COLLATE`) with
:func:`begin` and close it with :func:`end`; between the two they set the scope's
``position`` and ``index``. The scope's key is a hash of ``(epoch seed, kind, position,
index)``, equal in every process and thread.

The first time a loader iterates, :func:`install` wraps the module-level functions of
``numpy.random``, ``random`` and (once imported) ``torch``'s random functions and in-place
``Tensor`` samplers. A wrapper looks up the calling thread's scope; with no scope it calls
the original. Seeding is lazy: a sample that draws nothing costs two attribute writes.
Code that imported a function directly (``from numpy.random import rand``) before the
first loader, or that makes its own unseeded generator (``np.random.default_rng()``), is
not covered: ``sample_rng()`` is.

In a process worker, the generators ``worker_init_fn`` seeds (found with
:func:`seeding_watch`) are handed back to the user with :func:`leave_to_user`: their
global functions then draw from the global generator itself.
"""

from __future__ import annotations

import contextlib
import functools
import random as _random
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "BATCH",
    "COLLATE",
    "GENERATORS",
    "SAMPLE",
    "begin",
    "current_scope",
    "end",
    "install",
    "leave_to_user",
    "seeding_watch",
]

_MASK64 = (1 << 64) - 1
SAMPLE, BATCH, COLLATE = 1, 2, 3  # scope kinds: a key never collides across kinds
_local = threading.local()
GENERATORS = ("numpy", "python", "torch")  # the global generators served from scopes
_TORCH_DEFAULT_SEED = 67280421310721  # torch.initial_seed() of a freshly imported torch
# Process-wide: generators that worker_init_fn seeded in this (worker) process; their
# global functions are no longer served from scopes here. See leave_to_user().
_left_to_user: frozenset[str] = frozenset()


def _mix(a: int, b: int) -> int:
    """splitmix64 of a combined with b: a cheap, well-spread 64-bit hash."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _Scope:
    """A thread's random scope: ``base`` (epoch seed and kind) and the current ``position``.

    Setting ``position`` is all the per-sample work; each generator is reseeded only when
    a draw finds it seeded for another position.
    """

    __slots__ = (
        "_numpy",
        "_numpy_at",
        "_python",
        "_python_at",
        "_torch",
        "_torch_at",
        "base",
        "index",
        "position",
    )

    def __init__(self) -> None:
        self.base = 0
        self.position = 0
        self.index: Any = None  # the sample's dataset index, or the batch's indices
        self._numpy = np.random.RandomState(0)
        self._python = _random.Random(0)
        self._torch: Any = None
        self._numpy_at = self._python_at = self._torch_at = None

    @property
    def key(self) -> int:
        return _mix(_mix(self.base, self.position), _index_key(self.index))

    def _at(self) -> tuple[int, int, int]:
        return (self.base, self.position, _index_key(self.index))

    def numpy(self) -> np.random.RandomState:
        at = self._at()
        if self._numpy_at != at:
            key = self.key
            self._numpy.seed((key & 0xFFFFFFFF) ^ (key >> 32))
            self._numpy_at = at
        return self._numpy

    def py(self) -> _random.Random:
        at = self._at()
        if self._python_at != at:
            self._python.seed(self.key)
            self._python_at = at
        return self._python

    def torch_generator(self) -> Any:
        at = self._at()
        if self._torch_at != at:
            if self._torch is None:
                import torch

                self._torch = torch.Generator()
            self._torch.manual_seed(self.key & 0x7FFFFFFFFFFFFFFF)
            self._torch_at = at
        return self._torch


def _index_key(index: Any) -> int:
    """A stable 64-bit key of a dataset index (or a batch's indices), equal in every process."""
    if index is None:
        return 0
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        return (int(index) + 1) & _MASK64
    try:
        ints = np.asarray(index, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        ints = None
    data = ints.tobytes() if ints is not None and ints.dtype.kind == "i" else repr(index).encode()
    return zlib.crc32(data) | (len(data) << 32)


def current_scope() -> _Scope | None:
    """The calling thread's open scope, or ``None`` outside loading."""
    return _local.__dict__.get("scope")


def begin(epoch_seed: int, kind: int) -> tuple[_Scope, _Scope | None]:
    """Makes this thread's scope current for ``kind`` draws of an epoch.

    Returns the scope (set its ``position`` before each sample or batch) and the scope
    that was current before, to pass to :func:`end`.
    """
    install()
    scope = _local.__dict__.get("reusable")
    if scope is None:
        scope = _local.reusable = _Scope()
    previous = _local.__dict__.get("scope")
    if previous is scope:  # nested (a collate inside a fetch): keep the outer one's state
        scope = _Scope()
    scope.base = _mix(epoch_seed & _MASK64, kind)
    scope.index = None
    # what the generators were seeded for in an earlier block means nothing now: the global
    # generators may have drawn since (a sample with the same key, e.g. the first of another
    # loader built with the same seed, would otherwise go on from where those draws left)
    scope._numpy_at = scope._python_at = scope._torch_at = None
    _local.scope = scope
    return scope, previous


def end(previous: _Scope | None) -> None:
    """Restores the scope that :func:`begin` replaced."""
    _local.scope = previous


@contextlib.contextmanager
def seeding_watch() -> Iterator[set[str]]:
    """Collects the global generators the calling thread seeds in the block.

    Yields a set that, when the block ends, holds ``"numpy"`` (``np.random.seed`` or
    ``set_state`` was called), ``"python"`` (``random.seed`` or ``setstate``) and
    ``"torch"`` (``torch.initial_seed()`` changed: ``torch.manual_seed`` or
    ``torch.seed``). Calls made inside a loading scope do not count.
    """
    install()
    torch = sys.modules.get("torch")
    before = torch.initial_seed() if torch is not None else _TORCH_DEFAULT_SEED
    seeded: set[str] = set()
    _local.seeded = seeded
    try:
        yield seeded
    finally:
        _local.seeded = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.initial_seed() != before:
            seeded.add("torch")


def leave_to_user(generators: Iterable[str]) -> None:
    """Stops serving ``generators`` from scopes in this process (a process worker).

    Their global functions then draw from the global generator itself, which
    ``worker_init_fn`` seeded.
    """
    global _left_to_user
    _left_to_user = frozenset(generators)


# -- wrapping the global generators ------------------------------------------------
_installed: set[str] = set()
_install_lock = threading.Lock()
_NUMPY_SKIP = frozenset({"RandomState", "get_bit_generator", "set_bit_generator"})
_TORCH_FUNCTIONS = (
    "rand",
    "randn",
    "randint",
    "randperm",
    "bernoulli",
    "multinomial",
    "normal",
    "poisson",
)
_TORCH_METHODS = (
    "uniform_",
    "normal_",
    "random_",
    "bernoulli_",
    "exponential_",
    "cauchy_",
    "log_normal_",
    "geometric_",
)


def install() -> None:
    """Wraps the global random functions (idempotent; torch once it is imported)."""
    if "torch" in _installed or ("numpy" in _installed and "torch" not in sys.modules):
        return
    with _install_lock:
        if "numpy" not in _installed:
            _wrap_numpy()
            _wrap_python()
            _installed.add("numpy")
        torch = sys.modules.get("torch")
        if torch is not None and "torch" not in _installed and hasattr(torch, "Generator"):
            _wrap_torch(torch)
            _installed.add("torch")


_NUMPY_SEEDING = frozenset({"seed", "set_state"})
_PYTHON_SEEDING = frozenset({"seed", "setstate"})


def _wrap_numpy() -> None:
    module = np.random
    for name in np.random.mtrand.__all__:
        if name in _NUMPY_SKIP:
            continue
        original = getattr(module, name, None)
        if original is None or getattr(original, "__stoker_original__", None) is not None:
            continue
        pick = lambda scope, name=name: getattr(scope.numpy(), name)
        setattr(module, name, _dispatch(original, pick, "numpy", seeds=name in _NUMPY_SEEDING))


def _wrap_python() -> None:
    for name in _random.__all__:
        original = getattr(_random, name)
        if isinstance(original, type) or getattr(original, "__stoker_original__", None) is not None:
            continue
        pick = lambda scope, name=name: getattr(scope.py(), name)
        setattr(_random, name, _dispatch(original, pick, "python", seeds=name in _PYTHON_SEEDING))


def _dispatch(
    original: Callable[..., Any],
    pick: Callable[[_Scope], Callable[..., Any]],
    generator: str,
    *,
    seeds: bool,
) -> Callable[..., Any]:
    """The wrapper of one global function of ``generator`` ("numpy" or "python").

    ``seeds``: the function seeds the global generator; outside a scope the call is
    recorded for :func:`seeding_watch`.
    """
    if seeds:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            local = _local.__dict__
            scope = local.get("scope")
            if scope is None or generator in _left_to_user:
                seeded = local.get("seeded")
                if seeded is not None:
                    seeded.add(generator)
                return original(*args, **kwargs)
            return pick(scope)(*args, **kwargs)

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = _local.__dict__.get("scope")
            if scope is None or generator in _left_to_user:
                return original(*args, **kwargs)
            return pick(scope)(*args, **kwargs)

    wrapper.__stoker_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_torch(torch: Any) -> None:
    for name in _TORCH_FUNCTIONS:
        original = getattr(torch, name, None)
        if original is not None and getattr(original, "__stoker_original__", None) is None:
            setattr(torch, name, _with_generator(original, method=False))
    for name in _TORCH_METHODS:
        original = getattr(torch.Tensor, name, None)
        if original is not None and getattr(original, "__stoker_original__", None) is None:
            setattr(torch.Tensor, name, _with_generator(original, method=True))


def _with_generator(original: Callable[..., Any], *, method: bool) -> Callable[..., Any]:
    """Adds ``generator=`` (the scope's) to a CPU torch random call that has none."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = _local.__dict__.get("scope")
        if scope is None or kwargs.get("generator") is not None or "torch" in _left_to_user:
            return original(*args, **kwargs)
        if method:
            if args[0].device.type != "cpu":
                return original(*args, **kwargs)
        else:
            device = kwargs.get("device")
            if device is not None and str(device).split(":")[0] != "cpu":
                return original(*args, **kwargs)
            if args and hasattr(args[0], "device") and args[0].device.type != "cpu":
                return original(*args, **kwargs)
        kwargs["generator"] = scope.torch_generator()
        return original(*args, **kwargs)

    wrapper.__stoker_original__ = original  # type: ignore[attr-defined]
    return wrapper
