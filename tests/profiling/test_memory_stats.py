"""Per-worker memory in loader.stats(), and the warning for steadily growing workers."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import stoker.profiling.memory as memory
from stoker import DataLoader
from stoker.compact import StringArray


class Leaky:
    """Each fetch keeps 8 MiB of private memory in the worker, like copy-on-read would."""

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        self.kept.append(np.ones(2**20, dtype=np.float64))  # touched: really private
        return i


def test_stats_report_unique_and_proportional_memory_per_process() -> None:
    loader = DataLoader(list(range(64)), batch_size=8, num_workers=2, persistent_workers=True)
    list(loader)
    stats = loader.stats()
    assert set(stats.memory) == {"trainer", "worker 0", "worker 1"}
    for m in stats.memory.values():
        assert 0 < m.uss <= m.rss and 0 < m.pss <= m.rss
    assert "memory (unique / proportional MiB): trainer " in str(stats)
    loader.close()
    assert memory.process_memory(os.getpid()).rss > 0


def test_a_worker_whose_private_memory_keeps_growing_is_named(monkeypatch) -> None:
    monkeypatch.setattr(memory, "_CHECK_EVERY_S", 0.0)
    loader = DataLoader(Leaky(), batch_size=2, num_workers=1, prefetch_factor=1)
    with pytest.warns(ResourceWarning) as caught:
        for _batch in loader:
            if caught:
                break  # named within a few batches; stop before it eats more memory
    assert len(caught) == 1
    text = str(caught[0].message)
    assert text.startswith("worker 0's private memory grew from ")
    assert "copy-on-read" in text and "stoker.compact.StringArray" in text


class Paths:
    def __init__(self, paths) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


def worker_growth(paths) -> int:
    """Growth of the worker's private memory while it reads every path once.

    The trainer's objects are frozen out of the collector's reach first: in a test process
    with torch, Ray and the frameworks loaded, one full collection in the forked worker
    writes to the header of every inherited object and copies megabytes of pages, whenever
    it happens to run. What is measured is then the reading alone.
    """
    gc.collect()
    gc.freeze()
    try:
        loader = DataLoader(Paths(paths), batch_size=2048, num_workers=1)
        first = last = None
        for batch_number, _batch in enumerate(loader):
            if batch_number == 0:
                first = loader.stats().memory["worker 0"].uss
            last = loader.stats().memory["worker 0"].uss
    finally:
        gc.unfreeze()
    return last - first


def test_compact_paths_stay_flat_in_workers_where_a_list_grows() -> None:
    items = [f"/data/train/class_{i % 100}/img_{i:07d}.jpg" for i in range(300_000)]
    with pytest.warns(UserWarning, match=r"dataset\.\w+ is a list of str with 300,000 items"):
        list_growth = worker_growth(items)  # the loader warns before the worker copies the list
    compact_growth = worker_growth(StringArray(items))
    assert list_growth > 16 * 2**20  # copy-on-read: every str read dirties its page
    assert compact_growth < list_growth / 4, (compact_growth, list_growth)


class HoldsAnArray:
    """Reports whether its big array is a private copy in the worker or shared memory."""

    def __init__(self) -> None:
        self.array = np.arange(4 * 2**20, dtype=np.float64)  # 32 MiB

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return bool(self.array.flags.owndata), float(self.array[i * 1000])


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_share_the_datasets_arrays_instead_of_copying_them(context) -> None:
    loader = DataLoader(
        HoldsAnArray(), batch_size=2, num_workers=2, multiprocessing_context=context
    )
    owned, values = zip(
        *[(o, v) for batch in loader for o, v in zip(*batch, strict=True)], strict=True
    )
    assert values == (0.0, 1000.0, 2000.0, 3000.0)
    assert not any(owned)  # each worker maps the one shared copy
