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


def _run(
    loader: Any, epochs: int, stop_at: int | None
) -> tuple[list[tuple[int, Any]], dict[str, Any] | None, int]:
    """(epoch, batch) pairs until ``stop_at`` batches (then the state), and the last epoch."""
    out: list[tuple[int, Any]] = []
    for epoch in range(epochs):
        for batch in loader:
            out.append((epoch, to_plain(batch)))
            if stop_at is not None and len(out) == stop_at:
                state = loader.state_dict()
                return out, state, epoch
    return out, None, epochs


def _by_epoch(pairs: list[tuple[int, Any]], epochs: int) -> list[list[str]]:
    """Each epoch's batches as sorted canonical strings: the comparison for out-of-order runs."""
    grouped: list[list[str]] = [[] for _ in range(epochs)]
    for epoch, batch in pairs:
        grouped[epoch].append(json.dumps(batch, sort_keys=True, default=repr))
    return [sorted(g) for g in grouped]


def run_test_save_load_state(
    make_loader: Callable[..., Any], *, stop_at: int, epochs: int = 2, ordered: bool = True
) -> dict[str, Any]:
    """Checks that resuming after ``stop_at`` batches reproduces the uninterrupted run.

    ``make_loader(resumed: bool)`` builds a fresh loader; the resumed one may differ in
    how it loads (workers, mode) but not in what it loads. Returns the saved state.

    ``ordered=False`` (a loader with ``in_order=False``, whose order within an epoch depends
    on timing): every epoch of the resumed run must hold exactly the uninterrupted epoch's
    batches, each once, value for value, in any order.
    """
    reference_loader = make_loader(resumed=False)
    expected, _, _ = _run(reference_loader, epochs, None)
    _close(reference_loader)

    first = make_loader(resumed=False)
    head, state, stopped_in = _run(first, epochs, stop_at)
    _close(first)
    if state is None:
        raise AssertionError(f"stop_at={stop_at} is past the end ({len(head)} batches in all)")
    json.dumps(
        {k: v for k, v in state.items() if k not in ("sampler", "generator")}
    )  # plain values

    second = make_loader(resumed=True)
    second.load_state_dict(state)
    tail: list[tuple[int, Any]] = []
    epoch = stopped_in
    while epoch < epochs and len(head) + len(tail) < len(expected):
        # a state saved after an epoch's last batch resumes at that epoch's end: the first
        # resumed iter() yields nothing and the next one is the next epoch
        tail.extend((epoch, to_plain(batch)) for batch in second)
        epoch += 1
    _close(second)
    if ordered:
        assert_batches_equal([b for _, b in head + tail], [b for _, b in expected])
    else:
        ours, theirs = _by_epoch(head + tail, epochs), _by_epoch(expected, epochs)
        for e in range(epochs):
            assert ours[e] == theirs[e], (
                f"epoch {e}: the resumed run's batches differ from the uninterrupted run's"
            )
    return state


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()
