"""stoker.torch.DataLoader keeps torch's loader contract: its type, its iteration timing,
set_epoch in the orders frameworks call it, torch.Generator orders, and rebuilding.

Every test runs torch's own loader beside stoker's on the same dataset and compares.
"""

from __future__ import annotations

import inspect
import os

import pytest

torch = pytest.importorskip(
    "torch", reason="stoker.torch is the torch integration; torch is its oracle"
)
tud = torch.utils.data
from stoker._proc import descendants
from stoker.torch import (
    DataLoader,
    _accelerate,
)


class Squares(tud.Dataset):
    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i * i


def flat(batches) -> list[int]:
    return [int(v) for b in batches for v in b]


def test_it_is_a_torch_dataloader_with_torch_samplers() -> None:
    loader = DataLoader(Squares(), batch_size=4, shuffle=True)
    assert isinstance(loader, tud.DataLoader)
    assert isinstance(loader.sampler, tud.RandomSampler)
    assert isinstance(loader.batch_sampler, tud.BatchSampler)
    assert isinstance(DataLoader(Squares()).sampler, tud.SequentialSampler)
    assert loader.generator is None and loader.sampler.generator is None  # as torch leaves them
    assert loader.multiprocessing_context is None and loader._dataset_kind == 0
    # what torch's collate returns, for code that calls collate_fn itself
    assert torch.equal(loader.collate_fn([1, 2]), tud.default_collate([1, 2]))


def test_iter_starts_the_workers_but_not_the_epoch() -> None:
    """As torch's iter() does, stoker's starts the workers; the epoch waits for next()."""
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2)
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    it = iter(loader)
    assert len(it) == 6
    assert descendants(os.getpid()), "iter() did not start the workers"  # (forked: worker 0)
    assert torch.equal(torch.random.get_rng_state(), before), "iter() drew from the generator"
    del it
    assert wait_for(lambda: descendants(os.getpid()) == []), "a dropped iterator kept its workers"
    torch.manual_seed(3)
    first = flat(loader)  # the dropped iterator decided nothing: this is still epoch 0
    torch.manual_seed(3)
    fresh = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2)
    assert first == flat(fresh)


def test_a_failing_worker_init_fn_raises_in_iter() -> None:
    """torch's StatefulDataLoader raises it in iter(); stoker too, and stops the workers."""

    def fails(worker_id: int) -> None:
        raise ValueError(f"worker {worker_id} cannot start")

    loader = DataLoader(Squares(), batch_size=4, num_workers=2, worker_init_fn=fails)
    with pytest.raises(ValueError, match=r"worker \d cannot start") as raised:
        iter(loader)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "in worker_init_fn or while starting the worker" in notes
    assert wait_for(lambda: descendants(os.getpid()) == []), "the failed workers were left"
    with pytest.raises(ValueError, match="cannot start"):  # the next iter() tries again
        iter(loader)


INIT_SEED: list[int] = []


def remember_seed(worker_id: int) -> None:
    INIT_SEED[:] = [int(torch.initial_seed())]


class Seeds(tud.Dataset):
    """Each sample: its index, the worker's seed now, the seed worker_init_fn saw."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        return i, int(torch.initial_seed()), INIT_SEED[0]


def test_set_epoch_between_iter_and_next_gets_workers_seeded_for_it() -> None:
    """worker_init_fn sees the seed of the epoch that runs, even when set_epoch moves it
    after iter() started the workers (they are started again, for the right epoch)."""

    def epochs(late: bool) -> list[list[tuple[int, int, int]]]:
        sampler = tud.DistributedSampler(Seeds(), num_replicas=1, rank=0, seed=1)
        loader = DataLoader(
            Seeds(), sampler=sampler, num_workers=1, generator=7, worker_init_fn=remember_seed,
            collate_fn=lambda b: b,
        )  # fmt: skip
        seen = [list(loader)]
        if late:
            it = iter(loader)
            sampler.set_epoch(4)  # iter() started the workers for epoch 1
        else:
            sampler.set_epoch(4)
            it = iter(loader)
        seen.append(list(it))
        return [[sample for batch in epoch for sample in batch] for epoch in seen]

    late, early = epochs(late=True), epochs(late=False)
    assert late == early
    for epoch in late:
        assert all(seed == init for _, seed, init in epoch), "worker_init_fn saw another seed"
    assert late[0] != late[1]


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_in_lightnings_order_gives_torchs_epochs(num_workers) -> None:
    """Epoch 0: iter(loader), then sampler.set_epoch(0); later epochs: set_epoch(e), then iter."""
    dataset = Squares()
    orders = {}
    for name, cls in (("torch", tud.DataLoader), ("stoker", DataLoader)):
        sampler = tud.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=5)
        loader = cls(dataset, batch_size=3, sampler=sampler, num_workers=num_workers)
        seen = []
        for epoch in range(3):
            if epoch == 0:
                it = iter(loader)
                sampler.set_epoch(epoch)
            else:
                sampler.set_epoch(epoch)
                it = iter(loader)
            seen.append(flat(it))
        orders[name] = seen
    assert orders["stoker"] == orders["torch"]
    assert len({tuple(o) for o in orders["stoker"]}) == 3


def test_set_epoch_after_iter_is_honoured_with_workers_too() -> None:
    """torch's workers read the sampler inside iter(), so a set_epoch after it comes too late
    for them; stoker reads it at the first next(), with or without workers."""
    dataset = Squares()
    expected = []
    for epoch in range(3):
        sampler = tud.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=5)
        sampler.set_epoch(epoch)
        expected.append([i * i for i in sampler])
    sampler = tud.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=5)
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2)
    seen = []
    for epoch in range(3):
        it = iter(loader)
        sampler.set_epoch(epoch)
        seen.append(flat(it))
    assert seen == expected


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param({"num_workers": 0}, id="main"),
        pytest.param({"num_workers": 2}, id="workers"),
        pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent"),
    ],
)
def test_a_torch_generator_gives_torchs_order_in_every_epoch(workers) -> None:
    dataset = Squares()
    orders = {}
    for name, cls in (("torch", tud.DataLoader), ("stoker", DataLoader)):
        loader = cls(
            dataset,
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
            **workers,
        )
        orders[name] = [flat(loader) for _ in range(3)]
    assert orders["stoker"] == orders["torch"]
    assert len({tuple(o) for o in orders["stoker"]}) == 3


def rebuild(loader: DataLoader, framework: str, sampler=None) -> DataLoader:
    """A new loader made from ``loader``'s public attributes, as a framework makes one.

    ``"lightning"``: the loader's class, called with every attribute its ``__init__``
    names; ``"accelerate"``: called with torch's ``DataLoader`` arguments only (stoker's
    options then come from ``collate_fn``). With a ``sampler`` (Lightning's injected
    ``DistributedSampler``) it replaces the loader's; without, the rebuilt loader shuffles
    with a sampler of its own.
    """
    init = type(loader).__init__ if framework == "lightning" else tud.DataLoader.__init__
    params = inspect.signature(init).parameters
    kwargs = {k: v for k, v in vars(loader).items() if k in params and not k.startswith("_")}
    kwargs["multiprocessing_context"] = loader.multiprocessing_context
    kwargs.update(sampler=sampler, batch_sampler=None, shuffle=sampler is None)
    return type(loader)(**kwargs)


def test_a_rebuild_from_public_attributes_keeps_stokers_options() -> None:
    """What Lightning does: the loader's class, called with the attributes its __init__ names."""
    loader = DataLoader(
        Squares(), batch_size=4, shuffle=True, num_workers=2, worker_mode="thread",
        on_error="skip", max_errors=3, copy_batches=True, memory_budget=2**26, compact_dataset=True,
    )  # fmt: skip
    next(iter(loader))  # the base seed is drawn when the first epoch starts
    sampler = tud.DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False)
    rebuilt = rebuild(loader, "lightning", sampler)
    assert (rebuilt.worker_mode, rebuilt.on_error, rebuilt.max_errors) == ("thread", "skip", 3)
    assert (rebuilt.copy_batches, rebuilt.memory_budget, rebuilt.num_workers) == (True, 2**26, 2)
    assert rebuilt.compact_dataset is True
    assert flat(rebuilt) == [i * i for i in range(1, 23, 2)] + [0]  # rank 1 of 2, padded
    assert rebuilt._base_seed() == loader._seed, "the rebuilt loader drew a new base seed"


class Flaky(tud.Dataset):
    """Sample i: (i, a random draw); sample 5 cannot be read."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> tuple:
        if i == 5:
            raise ValueError(f"truncated record {i}")
        return i, torch.rand(())


def indices_and_draws(batches) -> list[tuple[list[int], list[float]]]:
    return [(b[0].tolist(), b[1].tolist()) for b in batches]


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_a_rebuilt_loader_skips_and_reports_a_bad_sample(framework) -> None:
    """on_error="skip" survives the rebuild as behaviour: the bad sample is left out of its
    batch and reported; the same rebuild of a loader built without it raises."""
    loader = DataLoader(Flaky(), batch_size=4, shuffle=True, num_workers=2, on_error="skip")
    sampler = tud.DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False)
    rebuilt = rebuild(loader, framework, sampler)
    batches = indices_and_draws(rebuilt)
    assert [i for b, _ in batches for i in b] == [1, 3, 7, 9, 11, 13, 15, 17, 19, 21, 0]
    assert [len(b) for b, _ in batches] == [3, 4, 4], "sample 5 was not left out of its batch"
    report = rebuilt.error_report()
    assert [(s.index, s.error_type, s.message) for s in report] == [
        (5, "ValueError", "truncated record 5")
    ]
    with pytest.raises(ValueError, match="truncated record 5"):
        list(rebuild(DataLoader(Flaky(), batch_size=4, num_workers=2), framework, sampler))


@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
@pytest.mark.parametrize("injected", [False, True], ids=["own-sampler", "rank-1-of-2"])
def test_a_rebuilt_loader_resumes_mid_epoch_exactly(framework, injected) -> None:
    """A rebuilt loader's state_dict, loaded into another loader rebuilt the same way (as a
    resumed job does), gives exactly the batches and draws the uninterrupted epoch gave."""

    def rebuilt() -> DataLoader:
        loader = DataLoader(
            Flaky(), batch_size=3, shuffle=True, num_workers=2, on_error="skip", max_errors=4
        )
        sampler = (
            tud.DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=True, seed=4)
            if injected
            else None
        )
        return rebuild(loader, framework, sampler)

    def epoch(loader: DataLoader, e: int):
        if injected:  # as Lightning does at every epoch's start
            loader.sampler.set_epoch(e)
        return iter(loader)

    torch.manual_seed(0)
    uninterrupted = rebuilt()
    full = [indices_and_draws(epoch(uninterrupted, e)) for e in range(2)]
    assert full[0] != full[1]

    torch.manual_seed(0)
    interrupted = rebuilt()
    list(epoch(interrupted, 0))
    it = epoch(interrupted, 1)
    first = indices_and_draws([next(it), next(it)])
    state = interrupted.state_dict()
    del it
    interrupted.close()

    torch.manual_seed(1)  # the resumed job's global generator is in another state
    resumed = rebuilt()
    resumed.load_state_dict(state)
    rest = indices_and_draws(epoch(resumed, 1))
    assert first == full[1][:2]
    assert rest == full[1][2:], "the resumed loader did not give the rest of the epoch"
    assert 5 not in [i for b, _ in full[1] for i in b]


def test_building_a_loader_leaves_torchs_global_generator_alone() -> None:
    """Code that draws after building the loader (a model's initial weights, accelerate's
    shared sampler seed) gets the numbers it gets with torch's loader."""
    for shuffle in (False, True):
        torch.manual_seed(3)
        DataLoader(Squares(), batch_size=4, shuffle=shuffle, num_workers=2)
        ours = torch.rand(3)
        torch.manual_seed(3)
        tud.DataLoader(Squares(), batch_size=4, shuffle=shuffle, num_workers=2)
        assert torch.equal(ours, torch.rand(3))


def test_torch_manual_seed_reproduces_a_run_without_a_generator() -> None:
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        loader = DataLoader(Squares(), batch_size=4, shuffle=True)
        runs.append([flat(loader) for _ in range(2)])
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]


def test_a_plain_torch_loader_rebuilt_from_its_arguments_still_gets_torch_batches() -> None:
    """A framework that builds torch's own loader from ours must not get numpy batches."""
    loader = DataLoader(tud.TensorDataset(torch.arange(10)), batch_size=4)
    plain = tud.DataLoader(loader.dataset, batch_size=4, collate_fn=loader.collate_fn)
    ours, theirs = list(loader), list(tud.DataLoader(loader.dataset, batch_size=4))
    for a, b, c in zip(ours, list(plain), theirs, strict=True):
        assert type(a[0]) is type(b[0]) is type(c[0]) is torch.Tensor
        assert torch.equal(a[0], c[0]) and torch.equal(b[0], c[0])


def test_setting_iterator_to_none_stops_persistent_workers() -> None:
    """Lightning ends a fit by resetting each loader's ``_iterator`` to None."""
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    assert flat(loader) == [i * i for i in range(23)]
    assert loader._iterator is not None and len(descendants(os.getpid())) >= 2
    loader._iterator = None
    assert loader._iterator is None
    assert descendants(os.getpid()) == []
    assert flat(loader) == [i * i for i in range(23)]  # a new epoch starts new workers
    loader.close()


def test_accelerate_is_taught_when_it_is_imported_later(tmp_path) -> None:
    """The hook that lets accelerate rebuild stoker loaders waits for accelerate's import."""
    import subprocess
    import sys

    code = (
        "import sys, stoker.torch\n"
        "assert 'accelerate' not in sys.modules\n"
        "import accelerate.data_loader as m\n"
        "assert getattr(m, '_stoker_builds_loaders', False), 'not installed after import'\n"
        "import torch\n"
        "assert type(m.DataLoader([1, 2], batch_size=2)) is torch.utils.data.DataLoader\n"
        "print('ok')\n"
    )
    pytest.importorskip("accelerate", reason="the hook is for Hugging Face accelerate")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert _accelerate.install_when_imported is not None


@pytest.mark.filterwarnings("ignore:.*DataPipe.*:UserWarning")  # torch's deprecation notice
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterdatapipe_shuffles_and_shards_as_with_torch(num_workers) -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    runs = {}
    for name, cls in (("torch", tud.DataLoader), ("stoker", DataLoader)):
        pipe = IterableWrapper(range(40)).shuffle().sharding_filter()
        loader = cls(pipe, batch_size=5, shuffle=True, num_workers=num_workers)
        runs[name] = [flat(loader) for _ in range(2)]
        unshuffled = cls(
            IterableWrapper(range(40)).shuffle().sharding_filter(), batch_size=5, shuffle=False
        )
        assert flat(unshuffled) == list(range(40)), f"{name}: shuffle=False left the shuffler on"
    for name, epochs in runs.items():
        for order in epochs:
            assert sorted(order) == list(range(40)), f"{name}: not every element once"
        assert epochs[0] != epochs[1] and epochs[0] != list(range(40)), name
    torch.manual_seed(8)
    again = [flat(DataLoader(IterableWrapper(range(40)).shuffle().sharding_filter(), batch_size=5,
                             shuffle=True, num_workers=num_workers))]  # fmt: skip
    torch.manual_seed(8)
    assert again == [
        flat(
            DataLoader(
                IterableWrapper(range(40)).shuffle().sharding_filter(),
                batch_size=5,
                shuffle=True,
                num_workers=num_workers,
            )
        )
    ]


@pytest.mark.filterwarnings("ignore:.*DataPipe.*:UserWarning")
def test_an_iterdatapipe_refuses_thread_workers_that_would_share_one_graph() -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    with pytest.raises(ValueError) as caught:
        DataLoader(IterableWrapper(range(4)).sharding_filter(), num_workers=2, worker_mode="thread")
    assert str(caught.value) == (
        "an IterDataPipe graph is sharded per worker, and thread workers share one graph: "
        "use worker_mode='auto' (the default, which gives an IterDataPipe processes) "
        "or 'process', or num_workers=1"
    )


def test_the_iterators_workers_are_visible_as_torch_shows_them() -> None:
    """Code written for torch's loader reads ``iterator._workers`` (Process objects) right
    after iter(); stoker's iterator shows its worker processes there, started on demand."""
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    it = iter(loader)
    workers = it._workers
    assert [type(w).__name__ for w in workers] == ["ForkProcess", "ForkProcess"]
    assert all(w.is_alive() for w in workers) and {w.pid for w in workers} <= set(
        descendants(os.getpid())
    )
    assert flat(it) == [i * i for i in range(23)]
    for w in workers:
        w.join(10)
        assert not w.is_alive() and w.exitcode == 0
    assert iter(DataLoader(Squares()))._workers == []
