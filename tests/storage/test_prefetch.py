"""The Prefetcher: at most ``depth`` fetches run at once and at most ``depth + 1`` values wait
for the consumer, however slow it is; values come back in order."""

from __future__ import annotations

import threading
import time

import pytest

from stoker.storage import Prefetcher


class Tally:
    """Counts the fetches running and the values fetched but not yet consumed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.waiting = 0
        self.max_running = self.max_waiting = 0

    def fetch(self, item: int) -> int:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        time.sleep(0.01)
        with self.lock:
            self.running -= 1
            self.waiting += 1
            self.max_waiting = max(self.max_waiting, self.waiting)
        return item * 10

    def consumed(self) -> None:
        with self.lock:
            self.waiting -= 1


@pytest.mark.parametrize("depth", [1, 3])
def test_the_prefetcher_stays_within_its_depth(depth: int) -> None:
    tally = Tally()
    got = []
    with Prefetcher(list(range(20)), tally.fetch, depth=depth) as prefetcher:
        for _ in range(20):
            got.append(prefetcher.get())
            tally.consumed()
            time.sleep(0.02)  # a consumer slower than the fetches: they pile up to the bound
    assert got == [i * 10 for i in range(20)]
    assert tally.max_running <= depth
    assert tally.max_waiting <= depth + 1
    assert tally.max_waiting == depth + 1  # the bound is reached: it is what limits them


def test_close_releases_what_was_fetched_and_never_consumed() -> None:
    released = []
    prefetcher = Prefetcher(list(range(10)), lambda i: i, depth=2, release=released.append)
    assert prefetcher.get() == 0
    time.sleep(0.1)
    prefetcher.close()
    assert released and set(released) <= {1, 2, 3}  # at most depth + 1 were ahead
    with pytest.raises(IndexError, match="every item was consumed"):
        prefetcher.get()
