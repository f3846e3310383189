"""num_workers="auto" / prefetch_factor="auto": growth where it helps, within the budgets."""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import pytest

from stoker import DataLoader, IterableDataset, _proc
from stoker._proc import usable_cpus
from stoker.engine.autotune import available_memory


class CpuBound:
    """Pure-Python work per sample: one worker cannot keep up with a waiting consumer."""

    def __init__(self, n: int = 160) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        return np.full(3, i)


@pytest.mark.skipif(usable_cpus() < 2, reason="growing workers needs at least two cores")
def test_auto_adds_workers_while_they_cut_the_wait() -> None:
    loader = DataLoader(CpuBound(), batch_size=2, num_workers="auto", persistent_workers=True)
    assert loader.num_workers == max(1, usable_cpus() // 2)
    indices = sorted(int(v) for batch in loader for v in batch[:, 0])
    assert indices == list(range(160))  # growing mid-epoch loses and repeats nothing
    assert loader.num_workers == usable_cpus()
    history = loader.stats().autotune
    assert history[0].startswith(f"worker {usable_cpus() // 2} added: consumer waited ")
    assert "autotune: worker" in str(loader.stats())
    loader.close()


def test_auto_never_exceeds_the_cpu_budget() -> None:
    loader = DataLoader(CpuBound(120), batch_size=2, num_workers="auto", prefetch_factor="auto")
    list(loader)
    assert loader.num_workers <= usable_cpus()
    assert loader.prefetch_factor <= 8


class Big:
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        return np.full((64, 1024), i, dtype=np.float32)  # 256 KiB per sample


def test_the_memory_budget_starts_from_the_memory_the_machine_has_available() -> None:
    known = _proc.available_memory()
    if known is None:
        pytest.skip("the system does not say how much memory is available (no /proc/meminfo)")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 2**24 < known <= total  # bytes, not kB
    assert abs(available_memory() - known) < total // 10  # read again: the same, or close
    loader = DataLoader(CpuBound(8), batch_size=4)
    assert abs(loader.memory_budget - known // 4) < total // 10


def test_the_memory_budget_caps_the_slot_pool_and_says_so() -> None:
    batch_bytes = 4 * 64 * 1024 * 4
    loader = DataLoader(Big(), batch_size=4, num_workers=2, memory_budget=3 * batch_bytes)
    with pytest.warns(RuntimeWarning) as caught:
        values = [int(b[0, 0, 0]) for b in loader]
    assert values == list(range(0, 24, 4))
    assert str(caught[0].message) == (
        "memory_budget=3.0 MiB holds 2 batch slot(s) of 1.0 MiB, fewer than the 6 that "
        "num_workers=2 x prefetch_factor=2 (+2 held by you) would use: from now on at most 3 "
        "batch(es) are loaded ahead, and batches you hold beyond the slots travel through pipes. "
        "Raise memory_budget, or lower batch_size or prefetch_factor."
    )


def _stoker_shm_bytes() -> int:
    import os

    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"stoker-{os.getpid()}-") and not name.endswith(".alive"):
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(f"/dev/shm/{name}").st_blocks * 512  # pages really used
    return total


def test_a_budget_below_one_batch_keeps_one_batch_in_flight() -> None:
    """1 MiB budget, 1 MiB batches, 2 workers x prefetch 2: one batch is loaded ahead at a time
    (and one is held by the loop), never the four torch's rule would keep in flight."""
    batch_bytes = 4 * 64 * 1024 * 4
    loader = DataLoader(Big(), batch_size=4, num_workers=2, memory_budget=batch_bytes // 2)
    peak = 0
    values = []
    with pytest.warns(RuntimeWarning, match="from now on at most 1 batch"):
        for batch in loader:
            values.append(int(batch[0, 0, 0]))
            peak = max(peak, _stoker_shm_bytes())
            del batch
    assert values == list(range(0, 24, 4))
    assert peak <= 2.6 * batch_bytes, f"{peak / batch_bytes:.1f} batches of shared memory at once"


def test_autotuning_stays_within_the_memory_budget() -> None:
    batch_bytes = 4 * 64 * 1024 * 4
    loader = DataLoader(
        Big(),
        batch_size=4,
        num_workers="auto",
        prefetch_factor="auto",
        memory_budget=100 * batch_bytes,
    )
    list(loader)
    assert batch_bytes * (loader.num_workers * loader.prefetch_factor + 2) <= 100 * batch_bytes


def test_auto_for_an_iterable_dataset_is_fixed_at_the_cores() -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            from stoker import get_worker_info

            info = get_worker_info()
            return iter(range(info.id, 10, info.num_workers))

    loader = DataLoader(Stream(), batch_size=2, num_workers="auto")
    assert loader.num_workers == usable_cpus()
    assert sorted(int(v) for b in loader for v in b) == list(range(10))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefetch_factor": "auto"}, "prefetch_factor='auto' tunes background workers' buffers"),
        (
            {"num_workers": "many"},
            r"num_workers option should be non-negative \(an integer, or 'auto'\), got 'many' "
            r"\(.*'auto'",
        ),
        ({"num_workers": 1, "memory_budget": 0}, "memory_budget must be a positive integer, got 0"),
    ],
)
def test_bad_auto_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(CpuBound(), **kwargs)


class Growing:
    """Batches get bigger as the epoch goes on: later ones overflow the slots sized early."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return np.ones(16_384 * (1 + i // 4), dtype=np.float32)  # 64 KiB .. 640 KiB


def test_the_budget_holds_when_batches_grow_larger_than_expected() -> None:
    budget = 6 * 2**20
    loader = DataLoader(
        Growing(), batch_size=4, num_workers=2, memory_budget=budget, copy_batches=False
    )
    seen = []
    for batch in loader:
        seen.append(batch.shape[1])
        assert loader.stats().bytes_in_flight <= budget
    assert seen[-1] == 16_384 * 10  # every batch arrived, the largest too
