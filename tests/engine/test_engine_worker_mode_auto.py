"""worker_mode="auto": threads measured against processes, the faster kept, batches unchanged.

The trial's thresholds are shortened here (a few batches instead of a tenth of a second)
and its margin forced where a test needs a given outcome; one test lets the real
measurement decide, on work that holds the GIL.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import stoker
import stoker.loader
from engine.engine_datasets import Samples, ShardedStream, ThreadSafeDraws, record_init
from stoker.engine.mode_trial import ModeTrial

N, BATCH = 96, 4


def quick_trial(monkeypatch: pytest.MonkeyPatch, margin: float) -> None:
    """Measures over 3 batches per kind; ``margin`` inf keeps processes, 0 goes back to threads."""
    trial = functools.partial(ModeTrial, warmup=1, min_batches=3, min_s=0.0, margin=margin)
    monkeypatch.setattr(stoker.loader, "ModeTrial", trial)


def content(batches: list) -> list:
    """What a batch holds apart from who loaded it: indices, draws and data."""
    return [(b[0].tolist(), b[2].tolist(), b[3].tolist()) for b in batches]


def reference(dataset: object, **kwargs: object) -> list:
    return content(list(stoker.DataLoader(dataset, batch_size=BATCH, num_workers=0, **kwargs)))


@pytest.mark.parametrize(("margin", "kept"), [(float("inf"), "process"), (0.0, "thread")])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_switching_kinds_mid_epoch_changes_no_batch(monkeypatch, margin, kept, persistent) -> None:
    quick_trial(monkeypatch, margin)
    dataset = ThreadSafeDraws(N)
    options = {"shuffle": True, "generator": 7}
    single = stoker.DataLoader(dataset, batch_size=BATCH, num_workers=0, **options)
    expected = [content(list(single)) for _ in range(2)]
    loader = stoker.DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=2,
        worker_mode="auto",
        persistent_workers=persistent,
        **options,
    )
    with loader:
        first = list(loader)
        assert content(first) == expected[0]
        pids = [int(p) for b in first for p in b[1]]
        assert os.getpid() in pids, "the epoch started in thread workers"
        assert any(p != os.getpid() for p in pids), "the trial ran process workers"
        history = "\n".join(loader.stats().autotune)
        assert "worker_mode auto: threads" in history
        assert f"batches/s: {'processes' if kept == 'process' else 'threads'}" in history
        second = list(loader)
        loaded_by_trainer = {int(p) == os.getpid() for b in second for p in b[1]}
        assert loaded_by_trainer == {kept == "thread"}, "the next epoch runs the kept kind only"
        assert content(second) == expected[1]
        if persistent:
            assert loader._pool is not None and loader._pool.mode == kept


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_an_epoch_too_short_to_measure_processes_leaves_them_to_the_next(
    monkeypatch, persistent
) -> None:
    # 7 batches: the threads' window closes at the 4th, when at most 3 are left to load,
    # fewer than the 4 a process window needs: no process pool for the last few batches
    quick_trial(monkeypatch, float("inf"))
    dataset, short = ThreadSafeDraws(7 * BATCH), {"shuffle": True, "generator": 5}
    single = stoker.DataLoader(dataset, batch_size=BATCH, num_workers=0, **short)
    expected = [content(list(single)) for _ in range(3)]
    loader = stoker.DataLoader(
        dataset, batch_size=BATCH, num_workers=2, worker_mode="auto",
        persistent_workers=persistent, **short,
    )  # fmt: skip
    with loader:
        epochs = [list(loader) for _ in range(3)]
        history = "\n".join(loader.stats().autotune)
    by_trainer = [[int(p) == os.getpid() for b in epoch for p in b[1]] for epoch in epochs]
    assert all(by_trainer[0]), "the short first epoch stayed in threads"
    assert not any(by_trainer[1]), "the next epoch ran processes from its first batch"
    assert not any(by_trainer[2]), "processes measured in the second epoch were kept"
    assert [content(epoch) for epoch in epochs] == expected
    assert "too few batches left in this epoch to measure processes" in history
    assert "batches/s: processes" in history


def test_every_index_arrives_once_across_the_switch_out_of_order(monkeypatch) -> None:
    quick_trial(monkeypatch, float("inf"))
    loader = stoker.DataLoader(
        ThreadSafeDraws(N), batch_size=BATCH, num_workers=2, worker_mode="auto", in_order=False
    )
    seen = [i for b in loader for i in b[0].tolist()]
    assert sorted(seen) == list(range(N))


def test_a_state_saved_after_the_switch_resumes_exactly(monkeypatch) -> None:
    quick_trial(monkeypatch, float("inf"))
    options = {"batch_size": BATCH, "shuffle": True, "generator": 3}
    dataset = ThreadSafeDraws(N)
    loader = stoker.DataLoader(dataset, num_workers=2, worker_mode="auto", **options)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(12)]  # past the thread window and the switch
    state = loader.state_dict()
    tail = list(iterator)
    resumed = stoker.DataLoader(dataset, num_workers=2, worker_mode="auto", **options)
    resumed.load_state_dict(state)
    assert content(list(resumed)) == content(tail)
    assert content(head + tail) == reference(dataset, shuffle=True, generator=3)


def test_work_that_holds_the_gil_gets_processes(monkeypatch) -> None:
    # 2 ms of pure Python per sample: two threads take turns, two processes run at once.
    # The real measurement decides, over half-second windows (a busy machine's noise
    # averages out over them; the default windows are shorter).
    # A burst of other work during one window can still tip one measurement, so the choice
    # is made by up to three fresh loaders: processes must win two.
    monkeypatch.setattr(stoker.loader, "ModeTrial", functools.partial(ModeTrial, min_s=0.5))
    choices: list[str] = []
    while choices.count("processes") < 2 and choices.count("threads") < 2:
        loader = stoker.DataLoader(
            ThreadSafeDraws(1200, spin_s=0.002), batch_size=BATCH, num_workers=2,
            worker_mode="auto",
        )  # fmt: skip
        for _ in range(2):
            assert sum(len(b[0]) for b in loader) == 1200
        history = loader.stats().autotune
        assert len(history) == 1, history
        choices.append(history[0].rsplit(" ", 1)[-1])
    assert choices.count("processes") == 2, choices


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (
            lambda: stoker.DataLoader(Samples(8), batch_size=2, num_workers=2, worker_mode="auto"),
            "Samples does not declare thread_safe = True",
        ),
        (
            lambda: stoker.DataLoader(
                ThreadSafeDraws(8),
                batch_size=2,
                num_workers=2,
                worker_mode="auto",
                collate_fn=lambda batch: batch,
            ),
            "collate_fn does not declare thread_safe = True",
        ),
        (
            lambda: stoker.DataLoader(
                ThreadSafeDraws(8),
                batch_size=2,
                num_workers=2,
                worker_mode="auto",
                worker_init_fn=functools.partial(record_init, os.devnull),
            ),
            "worker_init_fn may set up per-process state",
        ),
        (
            lambda: stoker.DataLoader(
                ShardedStream(8, 4), batch_size=2, num_workers=2, worker_mode="auto"
            ),
            "an IterableDataset's streams are split by worker process",
        ),
    ],
    ids=["undeclared-dataset", "undeclared-collate", "worker-init-fn", "iterable"],
)
def test_auto_runs_processes_and_says_why_when_threads_are_not_safe(build, reason) -> None:
    loader = build()
    list(loader)
    history = loader.stats().autotune
    assert history == [f"worker_mode auto: processes, since {reason}"]
    assert loader._worker_kind() == "process"


def test_stokers_datasets_and_transforms_declare_thread_safety(tmp_path) -> None:
    from stoker.vision import Compose, DecodeImage, RandomHorizontalFlip, ToCHW

    arrays = stoker.ArrayDataset(np.arange(6))
    assert stoker.ArrayDataset(np.arange(3)).thread_safe is True
    assert stoker.ConcatDataset([arrays, arrays]).thread_safe is True
    assert stoker.ConcatDataset([arrays, Samples(3)]).thread_safe is False
    assert stoker.Subset(arrays, [0, 2]).thread_safe is True

    class Counting(stoker.ArrayDataset):
        def __getitem__(self, index):  # a subclass that may keep state of its own
            return super().__getitem__(index)

    assert Counting(np.arange(3)).thread_safe is False
    assert Compose([RandomHorizontalFlip(), ToCHW()]).thread_safe is True
    assert Compose([RandomHorizontalFlip(), lambda image: image]).thread_safe is False
    assert DecodeImage(Compose([ToCHW()])).thread_safe is True
    assert DecodeImage(lambda image: image).thread_safe is False
