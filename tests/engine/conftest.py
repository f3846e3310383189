"""Every engine test is followed by a leak check (see ``engine_harness``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import engine_harness
import pytest


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fails the test if it leaves a worker process or thread, a segment or a stack file."""
    before = engine_harness.baseline()
    yield
    gc.collect()  # an iterator the test dropped is shut down by its finalizer
    problems = engine_harness.leftovers(before)
    if problems:
        pytest.fail("the test left things behind:\n  " + "\n  ".join(problems), pytrace=False)
