"""A stream's state, captured cheaply now and made into a ``state_dict()`` only if asked.

A process worker captures its stream's state after every batch it loads: a
``loader.state_dict()`` needs the state after the last batch the trainer received, and by
then the worker has loaded further. Nearly every capture is dropped unasked, so a capture
must cost little; only one that is asked for becomes a state and is pickled.

* :func:`holds_state`: the object has ``state_dict`` / ``load_state_dict`` and, for
  stoker's own streams, its sources can save theirs too (a :class:`stoker.ShuffleBuffer`
  over a plain iterable cannot);
* :func:`capture`: a stream of stoker's captures itself through ``_capture_state()`` (a
  shuffle buffer keeps a mark in a log of its steps instead of copying its samples); any
  other object is asked for ``state_dict()``, pickled at once, so that a later change to
  what it returned cannot alter the capture;
* :func:`captured`: the ``state_dict()`` a capture stands for (``None``: the stream is at
  an epoch's start, with nothing to restore).

A stream of stoker's implements the three methods of :class:`CapturesState`.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol, runtime_checkable

__all__ = ["CapturesState", "capture", "captured", "holds_state"]


@runtime_checkable
class CapturesState(Protocol):
    """A stream that captures its state cheaply (stoker's readers, ShuffleBuffer, Mix)."""

    def _saves_state(self) -> bool:
        """Whether ``state_dict()`` can describe a running iteration (its sources can too)."""

    def _capture_state(self) -> Any:
        """A cheap snapshot of where the stream stands; ``None``: at an epoch's start."""

    def _captured_state(self, capture: Any) -> dict[str, Any] | None:
        """The ``state_dict()`` that ``capture`` stands for; ``None`` for a ``None`` capture."""


class _Pickled:
    """A ``state_dict()`` pickled when it was captured."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob


def _captures_itself(obj: Any) -> bool:
    return getattr(type(obj), "_capture_state", None) is not None  # (cheaper than isinstance)


def holds_state(obj: Any) -> bool:
    """``obj`` can save and restore its place (see the module docs)."""
    if not (
        callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    ):
        return False
    return obj._saves_state() if _captures_itself(obj) else True


def capture(obj: Any) -> Any:
    """A snapshot of ``obj``'s state, cheap for stoker's streams (see the module docs)."""
    if _captures_itself(obj):
        return obj._capture_state()
    return _Pickled(pickle.dumps(obj.state_dict(), protocol=pickle.HIGHEST_PROTOCOL))


def captured(obj: Any, snapshot: Any) -> Any:
    """The ``state_dict()`` of ``obj`` that ``snapshot`` (from :func:`capture`) stands for."""
    if snapshot.__class__ is _Pickled:
        return pickle.loads(snapshot.blob)
    if snapshot is None:
        return None
    return obj._captured_state(snapshot)
