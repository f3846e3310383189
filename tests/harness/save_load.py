"""The save/load-state round trip, reusable by any loader test.

``run_test_save_load_state(make_loader, stop_at, epochs)`` runs a loader uninterrupted for
``epochs`` epochs, then runs it again but stops after ``stop_at`` batches (counted across
epochs), takes ``state_dict()``, builds a *new* loader (``make_loader(resumed=True)``, which
may use another ``num_workers`` or worker mode), loads the state and finishes. The batches
of the two runs must be identical, value for value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["assert_batches_equal", "run_test_save_load_state", "to_plain"]


def to_plain(batch: Any) -> Any:
    """A batch as nested lists / dicts of Python values (copies out of shared memory)."""
    if isinstance(batch, dict):
        return {k: to_plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [to_plain(v) for v in batch]
    if hasattr(batch, "tolist"):
        return np.asarray(batch).tolist()
    return batch


def assert_batches_equal(ours: list[Any], expected: list[Any]) -> None:
    assert len(ours) == len(expected), f"{len(ours)} batches != {len(expected)} expected"
    for i, (a, b) in enumerate(zip(ours, expected, strict=True)):
        assert a == b, f"batch {i} differs:\n{a}\n!=\n{b}"


def _run(loader: Any, epochs: int, stop_at: int | None) -> tuple[list[Any], dict[str, Any] | None, int]:
    """Batches until ``stop_at`` (then the state, round-tripped through JSON-able types)."""
    out: list[Any] = []
    for epoch in range(epochs):
        for batch in loader:
            out.append(to_plain(batch))
            if stop_at is not None and len(out) == stop_at:
                state = loader.state_dict()
                return out, state, epoch
    return out, None, epochs


def run_test_save_load_state(
    make_loader: Callable[..., Any], *, stop_at: int, epochs: int = 2
) -> dict[str, Any]:
    """Checks that resuming after ``stop_at`` batches reproduces the uninterrupted run.

    ``make_loader(resumed: bool)`` builds a fresh loader; the resumed one may differ in
    how it loads (workers, mode) but not in what it loads. Returns the saved state.
    """
    reference_loader = make_loader(resumed=False)
    expected, _, _ = _run(reference_loader, epochs, None)
    _close(reference_loader)

    first = make_loader(resumed=False)
    head, state, stopped_in = _run(first, epochs, stop_at)
    _close(first)
    if state is None:
        raise AssertionError(f"stop_at={stop_at} is past the end ({len(head)} batches in all)")
    json.dumps({k: v for k, v in state.items() if k not in ("sampler", "generator")})  # plain values

    second = make_loader(resumed=True)
    second.load_state_dict(state)
    tail: list[Any] = []
    for _epoch in range(stopped_in, epochs):
        tail.extend(to_plain(batch) for batch in second)
        if len(head) + len(tail) >= len(expected):
            break
    _close(second)
    assert_batches_equal(head + tail, expected)
    return state


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()
