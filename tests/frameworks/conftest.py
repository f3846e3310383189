"""Real training frameworks drive stoker.torch here, beside torch's own loader.

Every test is followed by a check that no worker process is left behind.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator

import pytest

from stoker._proc import descendants as _descendants

_SETTLE_S = 10.0


@pytest.fixture(autouse=True)
def no_worker_left_behind() -> Iterator[None]:
    yield
    gc.collect()
    deadline = time.monotonic() + _SETTLE_S
    while _descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _descendants(os.getpid())
    assert not left, f"the test left processes behind: {left}"
