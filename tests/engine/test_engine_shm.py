"""Shared-memory transport: zero-copy views, the lease rule, slot growth, /dev/shm limits."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from engine.engine_datasets import Growing, Samples
from harness import leaks as engine_harness
from stoker import DataLoader, ShmError
from stoker.engine import segments, slots

WIDTH = 4096  # float64 values per sample: 32 KiB, so a batch of 4 is 128 KiB (> 64 KiB)


def check_batch(batch: tuple, width: int = WIDTH) -> None:
    indices = batch[0].tolist()
    data = batch[4]
    assert data.shape == (len(indices), width)
    expected = np.repeat(np.asarray(indices, np.float64)[:, None], width, axis=1)
    np.testing.assert_array_equal(data, expected)


def test_large_batches_arrive_as_views_of_shared_memory() -> None:
    loader = DataLoader(Samples(48, width=WIDTH), batch_size=4, num_workers=2)
    seen_segments = False
    batches = []
    for batch in loader:
        check_batch(batch)
        assert batch[4].base is not None and not batch[4].flags.owndata  # a view, not a copy
        seen_segments = seen_segments or bool(engine_harness.data_segments(os.getpid()))
        batches.append(batch[0].tolist())
    assert seen_segments  # the slot pool really was in /dev/shm while the epoch ran
    assert [i for b in batches for i in b] == list(range(48))
    assert engine_harness.shm_segments(os.getpid()) == []  # the epoch's end unlinked every slot


def test_large_batches_in_thread_mode_use_no_shared_memory() -> None:
    for batch in DataLoader(
        Samples(24, width=WIDTH), batch_size=4, num_workers=2, worker_mode="thread"
    ):
        check_batch(batch)
        assert engine_harness.shm_segments(os.getpid()) == []


@pytest.mark.parametrize("copy_batches", [False, True], ids=["views", "copies"])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_kept_batches_are_never_overwritten(mode: str, copy_batches: bool) -> None:
    """The lease rule: a slot is reused only once nothing views the batch in it."""
    loader = DataLoader(
        Samples(160, width=WIDTH),
        batch_size=4,
        num_workers=2,
        worker_mode=mode,
        copy_batches=copy_batches,
    )
    kept = []
    for number, batch in enumerate(loader):
        check_batch(batch)
        if number % 2 == 0:  # keep 20, drop 20: dropped slots are reused while kept ones are held
            kept.append(batch)
    assert len(kept) == 20
    gc.collect()
    for number, batch in enumerate(kept):
        assert batch[0].tolist() == list(range(8 * number, 8 * number + 4))
        check_batch(batch)
    if mode == "process" and copy_batches:
        assert all(b[4].flags.owndata for b in kept)  # copied out of the slot
    if mode == "process" and not copy_batches:
        assert all(not b[4].flags.owndata for b in kept)  # zero-copy views, still intact


def test_kept_views_stay_valid_after_the_pool_is_gone() -> None:
    loader = DataLoader(Samples(16, width=WIDTH), batch_size=4, num_workers=2)
    kept = list(loader)
    del loader
    gc.collect()
    assert engine_harness.shm_segments(os.getpid()) == []  # unlinked, yet still mapped by the views
    for batch in kept:
        check_batch(batch)
    assert [b[0].tolist() for b in kept] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
def test_batches_that_outgrow_their_slot_are_still_correct(in_order: bool) -> None:
    ds = Growing(40, batch_size=4, width=2048)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2, in_order=in_order))
    assert sorted(i for b in batches for i in b[0].tolist()) == list(range(40))
    for batch in batches:
        first = int(batch[0][0])
        check_batch(batch, width=2048 * (first // 4 + 1))


def test_slot_pool_refuses_more_than_dev_shm_has_free() -> None:
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    with pytest.raises(ShmError, match=r"--shm-size") as excinfo:
        slots.SlotPool(count=1, size=free + 2**30)
    text = str(excinfo.value)
    assert "MiB free" in text and "batch_size" in text  # says how much and what to lower
    assert isinstance(excinfo.value, OSError)
    assert engine_harness.shm_segments(os.getpid()) == []


def test_slot_lease_returns_the_slot_when_the_last_view_dies() -> None:
    pool = slots.SlotPool(count=2, size=4096)
    try:
        assert pool.names == [] and pool.num_free == 2  # slots are created when first needed
        ref = pool.acquire()
        assert ref is not None and pool.num_free == 1
        assert len(pool.names) == 1 and os.path.exists(f"/dev/shm/{pool.names[0]}")
        view = np.frombuffer(pool.lease(ref.index), dtype=np.uint8)
        view[:3] = [1, 2, 3]
        assert pool.num_free == 1  # still leased while the view lives
        del view
        gc.collect()
        assert pool.num_free == 2
        a, b = pool.acquire(), pool.acquire()
        assert (
            a is not None and b is not None and pool.acquire() is None
        )  # exhausted: None, not a reuse
        held = np.frombuffer(pool.lease(a.index), dtype=np.uint8)
        held[:] = 7
    finally:
        pool.close()
        pool.close()  # idempotent
    assert engine_harness.shm_segments(os.getpid()) == []
    assert held.sum() == 7 * held.size  # the mapping outlives the unlinked segment


_HOLDER = """
import os, sys, time, fcntl, _posixshmem
prefix = sys.argv[1]
fd = _posixshmem.shm_open("/" + prefix + ".alive", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
data = _posixshmem.shm_open("/" + prefix + "-1", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(data, 4096)
print("ready", flush=True)
time.sleep(120)
"""


def _exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def test_the_orphan_sweep_spares_a_live_pool_whose_pid_it_cannot_see() -> None:
    """Two trainers sharing /dev/shm but not a PID namespace (docker --ipc=host): the other
    trainer's pid is invisible here, its pool's lock is not. A real process holds the lock
    of a pool named after a pid that does not exist on this machine."""
    import subprocess
    import sys

    invisible = 4_194_000 + os.getpid() % 300  # above any pid this machine hands out
    prefix = f"stoker-{invisible}-0c0ffee0"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, prefix], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert segments.remove_orphaned_segments() == []
        assert _exists(f"{prefix}-1") and _exists(f"{prefix}.alive")
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # its holder is gone: now the pool is an orphan and goes, lock and all
    assert sorted(segments.remove_orphaned_segments()) == sorted([f"{prefix}-1", f"{prefix}.alive"])
    assert not _exists(f"{prefix}-1") and not _exists(f"{prefix}.alive")


def test_a_lockless_segment_goes_only_when_its_pid_is_not_running() -> None:
    """Segments without a lock (from a stoker older than the lock) keep the pid rule."""
    dead = f"stoker-{4_194_000 + os.getpid() % 300}-0dead000-1"
    alive = f"stoker-{os.getppid()}-0a11fe00-1"  # the test runner's parent: running
    for name in (dead, alive):
        fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.close(fd)
    try:
        assert segments.remove_orphaned_segments() == [dead]
        assert not _exists(dead) and _exists(alive)
    finally:
        for name in (dead, alive):
            if _exists(name):
                os.unlink(f"/dev/shm/{name}")


def test_a_running_process_pool_holds_its_prefix_alive() -> None:
    loader = DataLoader(
        Samples(48, width=WIDTH), batch_size=4, num_workers=2, persistent_workers=True
    )
    it = iter(loader)
    next(it)
    lock = f"{loader._pool.prefix}.alive"
    assert _exists(lock)
    assert segments.remove_orphaned_segments() == []
    loader.close()
    assert not _exists(lock)


def test_copy_batches_keeps_every_container_type() -> None:
    """copy_batches=True rebuilt containers by calling their type with one argument: a
    defaultdict batch (what a collate_fn building defaultdicts returns) failed."""
    from collections import OrderedDict, defaultdict

    def collate(samples: list) -> object:
        batch = defaultdict(list)
        batch["x"] = np.stack([s[4] for s in samples])
        batch["ordered"] = OrderedDict(ids=np.array([s[0] for s in samples]))
        return batch

    loader = DataLoader(
        Samples(16, width=WIDTH), batch_size=4, num_workers=2, copy_batches=True, collate_fn=collate
    )
    batches = list(loader)
    assert [type(b).__name__ for b in batches] == ["defaultdict"] * 4
    assert all(b.default_factory is list and type(b["ordered"]) is OrderedDict for b in batches)
    assert [b["ordered"]["ids"].tolist() for b in batches] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    assert all(b["x"].flags.owndata for b in batches)  # copied out of shared memory
