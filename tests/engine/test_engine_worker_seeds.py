"""Worker seeds as torch defines them, and the seeds a worker_init_fn sets.

A worker's seed is its epoch's base seed plus its id. Process workers seed Python's
``random``, numpy's global generator and torch's CPU generator with it before
``worker_init_fn`` runs, so ``get_worker_info().seed`` and ``torch.initial_seed()`` agree
there and while loading. A generator that ``worker_init_fn`` seeds is left to it: its
draws follow that seed, as with torch; the generators it does not seed keep stoker's
per-sample streams.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import random
import time

import numpy as np
import pytest

from engine.engine_datasets import (
    GlobalDraws,
    RangeStream,
    Recording,
    Samples,
    SharedCounter,
    StallingStream,
    WorkerSeeds,
    WorkersMeet,
    configure_in_init,
    log_seed_at_init,
    seed_globals_in_init,
    split_range_in_init,
)
from harness import leaks
from stoker import ArrayDataset, DataLoader
from stoker._proc import usable_cpus
from stoker.engine.pool import WorkerPool

MODES = ("process", "thread")
USER_SEED = 12345


def init_lines(path) -> dict[int, list[str]]:
    """worker id -> the fields :func:`log_seed_at_init` wrote for it."""
    return {int(line.split()[0]): line.split()[1:] for line in path.read_text().splitlines()}


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


# ------------------------------------------------------------------ what a worker knows


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_init_fn_sees_the_seed_the_worker_loads_with(context: str, tmp_path) -> None:
    log = tmp_path / "init.log"
    loader = DataLoader(
        WorkerSeeds(8),
        batch_size=2,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=functools.partial(log_seed_at_init, str(log)),
    )
    loaded = {int(w): int(s) for batch in loader for w, s in zip(batch[1], batch[2], strict=True)}
    at_init = {worker: int(fields[0]) for worker, fields in init_lines(log).items()}
    assert at_init == loaded  # not 0, and not changed behind worker_init_fn's back
    assert loaded[1] == loaded[0] + 1  # torch's rule: the base seed plus the worker id


def test_torch_initial_seed_in_a_process_worker_is_its_seed(tmp_path) -> None:
    torch = pytest.importorskip("torch", reason="checks torch.initial_seed() inside workers")
    log = tmp_path / "init.log"
    loader = DataLoader(
        WorkerSeeds(8),
        batch_size=2,
        num_workers=2,
        worker_init_fn=functools.partial(log_seed_at_init, str(log)),
    )
    batches = list(loader)
    for batch in batches:
        assert batch[3].tolist() == batch[2].tolist()  # torch.initial_seed() == info.seed
    for fields in init_lines(log).values():
        assert fields[1] == fields[0]  # already inside worker_init_fn
    seeds = {int(s) for batch in batches for s in batch[3]}
    assert len(seeds) == 2 and torch.initial_seed() not in seeds  # not the trainer's


@pytest.mark.parametrize("mode", MODES)
def test_worker_info_says_how_the_worker_runs(mode: str, tmp_path) -> None:
    log = tmp_path / "init.log"
    loader = DataLoader(
        WorkerSeeds(4),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        worker_init_fn=functools.partial(log_seed_at_init, str(log)),
    )
    list(loader)
    expected = ["multiprocessing", "none"] if mode == "process" else ["thread", "WorkerRNG"]
    assert {worker: fields[2:] for worker, fields in init_lines(log).items()} == {
        0: expected,
        1: expected,
    }


@pytest.mark.parametrize("persistent", [False, True], ids=["per_epoch", "persistent"])
def test_a_stream_sharded_in_worker_init_fn_stays_sharded(persistent: bool) -> None:
    # torch's documented pattern; stoker warns about unsharded streams (an error in this suite)
    loader = DataLoader(
        RangeStream(0, 20),
        batch_size=4,
        num_workers=2,
        persistent_workers=persistent,
        worker_init_fn=split_range_in_init,
    )
    for _epoch in range(2):
        assert sorted(i for batch in loader for i in batch.tolist()) == list(range(20))
    loader.close()


# ------------------------------------------------------------------ seeds set in worker_init_fn


def per_worker(items: list) -> dict[int, list[tuple[int, ...]]]:
    """worker id -> its items in the order it loaded them (ascending index)."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for item in sorted(items, key=lambda it: it[0]):
        out.setdefault(int(item[1]), []).append(tuple(int(v) for v in item))
    return out


def numpy_stream(seed: int, count: int) -> list[int]:
    state = np.random.RandomState(seed)
    return [int(state.randint(0, 2**30)) for _ in range(count)]


def python_stream(seed: int, count: int) -> list[int]:
    generator = random.Random(seed)
    return [generator.getrandbits(30) for _ in range(count)]


@pytest.mark.parametrize("persistent", [False, True], ids=["per_epoch", "persistent"])
def test_seeds_set_in_worker_init_fn_are_honoured(persistent: bool) -> None:
    loader = DataLoader(
        GlobalDraws(12),
        batch_size=None,
        num_workers=2,
        generator=7,
        persistent_workers=persistent,
        worker_init_fn=functools.partial(seed_globals_in_init, USER_SEED, "numpy,python"),
    )
    drawn = {0: 0, 1: 0}  # draws each worker made in earlier epochs
    try:
        for _epoch in range(2):
            workers = per_worker(list(loader))
            assert sorted(workers) == [0, 1]
            for worker, items in workers.items():
                # persistent workers are not reseeded between epochs: their streams go on
                skip = drawn[worker] if persistent else 0
                count = skip + len(items)
                assert [it[2] for it in items] == numpy_stream(USER_SEED, count)[skip:]
                assert [it[3] for it in items] == python_stream(USER_SEED, count)[skip:]
                drawn[worker] = count
    finally:
        loader.close()


def test_a_generator_worker_init_fn_does_not_seed_keeps_per_sample_streams() -> None:
    def load(**config) -> list:
        return sorted(list(DataLoader(GlobalDraws(12), batch_size=None, generator=7, **config)))

    reference = load()
    seeded = load(
        num_workers=2, worker_init_fn=functools.partial(seed_globals_in_init, USER_SEED, "numpy")
    )
    assert [it[3] for it in seeded] == [it[3] for it in reference]  # python: worker-independent
    assert [it[2] for it in seeded] != [it[2] for it in reference]  # numpy: the user's seed
    configured = load(num_workers=3, worker_init_fn=configure_in_init)
    assert [it[2:] for it in configured] == [it[2:] for it in reference]


def test_torch_manual_seed_in_worker_init_fn_is_honoured() -> None:
    torch = pytest.importorskip("torch", reason="checks torch's global generator in workers")
    items = list(
        DataLoader(
            GlobalDraws(8, use_torch=True),
            batch_size=None,
            num_workers=2,
            worker_init_fn=functools.partial(seed_globals_in_init, USER_SEED, "torch"),
        )
    )
    generator = torch.Generator().manual_seed(USER_SEED)
    expected = [int(torch.randint(0, 2**30, (), generator=generator)) for _ in range(len(items))]
    workers = per_worker(items)
    assert sorted(workers) == [0, 1]
    for loaded in workers.values():
        assert [it[4] for it in loaded] == expected[: len(loaded)]


def test_thread_workers_say_that_a_seed_in_worker_init_fn_does_not_reach_loading() -> None:
    reference = sorted(list(DataLoader(GlobalDraws(8), batch_size=None, generator=7)))
    state = np.random.get_state()
    try:
        with pytest.warns(UserWarning) as caught:
            items = list(
                DataLoader(
                    GlobalDraws(8),
                    batch_size=None,
                    num_workers=2,
                    worker_mode="thread",
                    generator=7,
                    worker_init_fn=functools.partial(seed_globals_in_init, USER_SEED, "numpy"),
                )
            )
    finally:
        np.random.set_state(state)
    texts = {str(w.message) for w in caught}
    assert texts == {
        "worker_init_fn seeded numpy's global generator in a thread worker, but thread workers "
        "share the trainer's global generators: draws made while loading still come from "
        "stoker's per-sample generators. For a stream of your own in each thread worker, use "
        "get_worker_info().rng, or use worker_mode='process'."
    }
    assert [it[2:] for it in sorted(items)] == [it[2:] for it in reference]


# ------------------------------------------------------------------ what workers are given


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_datasets_holding_multiprocessing_primitives_work_with(context: str) -> None:
    ctx = multiprocessing.get_context(context)
    dataset = SharedCounter(12, ctx)
    loader = DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context=ctx)
    assert [batch.tolist() for batch in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert dataset.count.value == 12  # the workers counted in the trainer's shared memory


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_the_first_samples_reach_every_worker_despite_a_staggered_start(context: str) -> None:
    # spawn and forkserver workers start one, then the rest: each still gets one of the first
    ctx = multiprocessing.get_context(context)
    loader = DataLoader(
        WorkersMeet(3, ctx), batch_size=None, num_workers=3, multiprocessing_context=ctx
    )
    assert sorted(loader) == [0, 1, 2]


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_as_many_workers_boot_at_once_as_there_are_cpus(context: str) -> None:
    # each boots on a CPU of its own; one more than the CPUs waits for worker 0 to be ready
    cpus = usable_cpus()
    workers = min(cpus, 4) + 1
    loader = DataLoader(
        Samples(12), batch_size=2, num_workers=workers, multiprocessing_context=context,
        persistent_workers=True,
    )  # fmt: skip
    pool = WorkerPool(loader._worker_spec(), workers, "process", loader.multiprocessing_context)
    try:
        booting = [pool.is_started(w) for w in range(workers)]
    finally:
        pool.shutdown()
    assert booting == [w < cpus for w in range(workers)]
    it = iter(loader)  # starts them all: the rest once worker 0 is ready
    assert loader._pool.initialised == set(range(workers))
    assert sorted(int(i) for batch in it for i in batch[0]) == list(range(12))
    loader.close()


def test_the_first_samples_reach_every_worker_even_when_one_answers_first(tmp_path) -> None:
    log = tmp_path / "fetch.log"
    loader = DataLoader(
        Recording(3, str(log)), batch_size=None, num_workers=3, multiprocessing_context="spawn"
    )
    it = iter(loader)
    it.start()  # the epoch starts: its first tasks go out, nothing is read
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)  # worker 0 is loading sample 0 before the others have started
    time.sleep(0.5)  # its answer now waits with its start-up message
    assert sorted(int(item[3]) for item in it) == [0, 1, 2]  # not two samples for worker 0


def test_an_unpicklable_worker_init_fn_gets_torchs_warning_and_is_named() -> None:
    def local_init_fn(worker: int) -> None:  # a closure: spawn and forkserver cannot send it
        pass

    loader = DataLoader(
        Samples(4),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="forkserver",
        worker_init_fn=local_init_fn,
    )
    with (
        pytest.warns(
            UserWarning, match="^Got pickle error when attempting to start a worker Process"
        ),
        pytest.raises((AttributeError, TypeError, pickle.PicklingError)) as excinfo,
    ):
        next(iter(loader))
    assert (
        "stoker could not pickle worker_init_fn (local_init_fn) for its forkserver workers; "
        "define it at module level, use multiprocessing_context='fork', or worker_mode='thread'"
    ) in notes(excinfo.value)


def test_a_lambda_collate_fn_under_spawn_names_it_and_the_fixes_and_leaves_nothing(
    tmp_path,
) -> None:
    # a dataset large enough that its array goes to the spec's shared segment before the
    # lambda fails to pickle: the segment must go with the failed start
    dataset = ArrayDataset(np.arange(64 * 1024, dtype=np.float64).reshape(-1, 16))
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=lambda batch: batch,
    )
    with (
        pytest.warns(UserWarning) as warned,
        pytest.raises((AttributeError, TypeError, pickle.PicklingError)) as excinfo,
    ):
        next(iter(loader))
    (warning,) = [w for w in warned if "pickle error" in str(w.message)]
    assert str(warning.message).startswith(
        "Got pickle error when attempting to start a worker Process. spawn workers receive the "
        "dataset, collate_fn and worker_init_fn pickled"
    )
    assert (
        "multiprocessing_context='fork' starts them by fork instead, and worker_mode='thread' "
        "runs the workers as threads: neither pickles anything."
    ) in str(warning.message)
    assert (
        "stoker could not pickle collate_fn (<lambda>) for its spawn workers; define it at "
        "module level, use multiprocessing_context='fork', or worker_mode='thread'"
    ) in notes(excinfo.value)
    assert leaks.shm_segments(os.getpid()) == []  # the spec's segment went at once
    del loader, excinfo
    assert leaks.worker_processes() == []


# ------------------------------------------------------------------ out-of-order streams


@pytest.mark.parametrize("mode", MODES)
def test_out_of_order_stream_delivers_a_fast_workers_items_while_another_stalls(
    mode: str, tmp_path
) -> None:
    release = tmp_path / "release"
    loader = DataLoader(
        StallingStream(6, str(release)),
        batch_size=None,
        num_workers=2,
        worker_mode=mode,
        in_order=False,
        timeout=20,
    )
    it = iter(loader)
    try:
        first = [next(it) for _ in range(6)]  # all of worker 1's items while worker 0 waits
    finally:
        release.touch()
    assert sorted(first) == list(range(6, 12))
    assert sorted(first + list(it)) == list(range(12))
