"""Every test is followed by the leak check (see ``harness/leaks.py``).

Any test may start workers, through a loader, a command or a framework: none of them,
their threads, pipes, shared-memory segments or stack files may outlive it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from hypothesis import settings

from harness import leaks

# `pytest --hypothesis-profile=long` draws ten times hypothesis's default number of examples
# (a deep search, not for CI); the slow properties draw a share of the profile's number.
settings.register_profile("long", max_examples=1000)


@pytest.fixture
def leak_settle_s() -> float:
    """How long a test's leftovers may take to go away; a folder's conftest may allow longer."""
    return leaks.SETTLE_S


@pytest.fixture(autouse=True)
def nothing_left_behind(leak_settle_s: float) -> Iterator[None]:
    """Fails the test if it leaves a worker process or thread, a pipe, a segment or a stack file."""
    before = leaks.baseline()
    yield
    problems = leaks.leftovers(before, settle_s=0.0)
    if problems:
        # an iterator the test dropped is shut down by its finalizer. Collected only when
        # something is left: a full collection of this process's heap (torch, Ray and the
        # frameworks are loaded) takes about 0.4 s, more than most tests
        gc.collect()
        problems = leaks.leftovers(before, settle_s=leak_settle_s)
    if problems:
        leaks.clean_up(before)  # one test's leak must not fail the tests after it
        pytest.fail("the test left things behind:\n  " + "\n  ".join(problems), pytrace=False)
