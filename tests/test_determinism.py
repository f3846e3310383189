"""The same seed gives the same batches, augmentations included, whatever the workers."""

from __future__ import annotations

import random

import numpy as np
import pytest

import stoker
from stoker import DataLoader, sample_rng


class Augmented:
    """Each sample draws from every common source of randomness."""

    def __init__(self, n: int = 24, use_torch: bool = False) -> None:
        self.n = n
        self.use_torch = use_torch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        sample = {
            "index": i,
            "numpy_global": np.random.rand(2),
            "numpy_int": np.random.randint(0, 1000),
            "python": random.random(),
            "stoker": sample_rng().normal(size=2),
        }
        if self.use_torch:
            import torch

            sample["torch"] = torch.rand(2).numpy()
            sample["torch_inplace"] = torch.empty(2).uniform_().numpy()
        return sample


def mixup(samples: list) -> dict:
    """A batch-level augmentation in collate_fn, drawing from numpy's global RNG."""
    batch = stoker.default_collate(samples)
    batch["lam"] = np.random.beta(0.4, 0.4)
    return batch


def epochs(loader, n: int = 2) -> list:
    out = [[{k: np.asarray(v) for k, v in batch.items()} for batch in loader] for _ in range(n)]
    if hasattr(loader, "close"):
        loader.close()
    return out


def assert_same_epochs(a: list, b: list) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b)
        for batch_a, batch_b in zip(epoch_a, epoch_b, strict=True):
            assert batch_a.keys() == batch_b.keys()
            for key in batch_a:
                np.testing.assert_array_equal(batch_a[key], batch_b[key], err_msg=key)


CONFIGS = [
    {"num_workers": 1},
    {"num_workers": 2},
    {"num_workers": 4},
    {"num_workers": 2, "worker_mode": "thread"},
    {"num_workers": 4, "worker_mode": "thread"},
    {"num_workers": 2, "persistent_workers": True},
    {"num_workers": 2, "persistent_workers": True, "worker_mode": "thread"},
    {"num_workers": 2, "in_order": True, "prefetch_factor": 1},
]


@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
def test_augmentations_do_not_depend_on_workers(config) -> None:
    kwargs = {"batch_size": 5, "shuffle": True, "generator": 1234, "collate_fn": mixup}
    reference = epochs(DataLoader(Augmented(), **kwargs))
    assert_same_epochs(epochs(DataLoader(Augmented(), **kwargs, **config)), reference)


def test_torch_draws_do_not_depend_on_workers() -> None:
    pytest.importorskip("torch", reason="checks torch's global RNG inside datasets")
    kwargs = {"batch_size": 4, "shuffle": True, "generator": 99}
    reference = epochs(DataLoader(Augmented(16, use_torch=True), **kwargs))
    for config in ({"num_workers": 2}, {"num_workers": 3, "worker_mode": "thread"}):
        assert_same_epochs(
            epochs(DataLoader(Augmented(16, use_torch=True), **kwargs, **config)), reference
        )


def test_epochs_differ_and_samples_differ() -> None:
    (first, second) = epochs(DataLoader(Augmented(), batch_size=24, generator=5))
    assert not np.array_equal(first[0]["numpy_global"], second[0]["numpy_global"])
    assert not np.array_equal(first[0]["stoker"], second[0]["stoker"])
    # within an epoch every sample gets its own draws
    assert len(np.unique(first[0]["python"])) == 24
    assert len(np.unique(first[0]["numpy_global"][:, 0])) == 24


def test_a_different_seed_gives_different_augmentations() -> None:
    a = epochs(DataLoader(Augmented(), batch_size=24, generator=1), 1)
    b = epochs(DataLoader(Augmented(), batch_size=24, generator=2), 1)
    assert not np.array_equal(a[0][0]["numpy_global"], b[0][0]["numpy_global"])


@pytest.mark.parametrize(
    "config", [{}, {"num_workers": 2, "worker_mode": "thread"}], ids=["main", "threads"]
)
def test_loading_leaves_the_trainers_global_rngs_alone(config) -> None:
    np.random.seed(7)
    random.seed(7)
    expected_np, expected_py = np.random.rand(), random.random()
    np.random.seed(7)
    random.seed(7)
    list(DataLoader(Augmented(), batch_size=6, generator=3, **config))
    assert np.random.rand() == expected_np
    assert random.random() == expected_py


def test_no_worker_init_fn_is_needed_for_distinct_worker_draws() -> None:
    batches = epochs(DataLoader(Augmented(), batch_size=1, num_workers=2, generator=0), 1)[0]
    values = [b["numpy_global"][0, 0] for b in batches]
    assert len(set(values)) == len(values)  # torch's classic bug: workers repeating draws


def test_sample_rng_outside_a_loader_follows_numpy_global_seed() -> None:
    np.random.seed(3)
    a = sample_rng().random()
    np.random.seed(3)
    assert sample_rng().random() == a


@pytest.mark.parametrize("batch_size", [None, 1])
def test_a_sample_draws_alike_in_two_loaders_built_with_one_seed(batch_size) -> None:
    """The last sample one loader loads and the first the next loads can be the same sample
    with the same seed: its draws must not go on from where the global generators stood
    (here, moved by the trainer's own draws in between)."""

    class One:
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> list[float]:
            return [float(np.random.rand()), random.random()]

    def draws() -> list:
        batches = DataLoader(One(), batch_size=batch_size, generator=7)
        return [np.asarray(b).tolist() for b in batches]

    first = draws()
    np.random.rand(3)  # the trainer draws between the two loaders
    random.random()
    assert draws() == first
