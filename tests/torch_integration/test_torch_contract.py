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


def test_iter_starts_nothing_until_the_first_next() -> None:
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2)
    it = iter(loader)
    assert len(it) == 6
    assert descendants(os.getpid()) == [], "iter() started workers"
    assert loader.sampler.epoch == 0, "iter() read the sampler"
    assert loader.state_dict()["epoch"] == 0, "iter() counted an epoch"
    del it
    first = flat(loader)  # the discarded iterator cost nothing: this is still epoch 0
    loader.sampler.set_epoch(0)
    assert first == flat(loader)


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


def test_a_rebuild_from_public_attributes_keeps_stokers_options() -> None:
    """What Lightning does: the loader's class, called with the attributes its __init__ names."""
    loader = DataLoader(
        Squares(), batch_size=4, shuffle=True, num_workers=2, worker_mode="thread",
        on_error="skip", max_errors=3, copy_batches=True, memory_budget=2**26, compact_dataset=True,
    )  # fmt: skip
    params = inspect.signature(type(loader).__init__).parameters
    kwargs = {k: v for k, v in vars(loader).items() if k in params and not k.startswith("_")}
    kwargs["multiprocessing_context"] = loader.multiprocessing_context
    kwargs["sampler"] = tud.DistributedSampler(
        loader.dataset, num_replicas=2, rank=1, shuffle=False
    )
    kwargs.update(batch_sampler=None, shuffle=False)
    next(iter(loader))  # the base seed is drawn when the first epoch starts
    kwargs["collate_fn"] = loader.collate_fn
    rebuilt = type(loader)(**kwargs)
    assert (rebuilt.worker_mode, rebuilt.on_error, rebuilt.max_errors) == ("thread", "skip", 3)
    assert (rebuilt.copy_batches, rebuilt.memory_budget, rebuilt.num_workers) == (True, 2**26, 2)
    assert rebuilt.compact_dataset is True
    assert flat(rebuilt) == [i * i for i in range(1, 23, 2)] + [0]  # rank 1 of 2, padded
    assert rebuilt._base_seed() == loader._seed, "the rebuilt loader drew a new base seed"


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
