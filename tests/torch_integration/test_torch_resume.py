"""stoker.torch resumes as torch users expect: torch's global generator draws included."""

from __future__ import annotations

import pytest

torch = pytest.importorskip(
    "torch", reason="resumes loaders over torch's samplers and torch's global generator"
)
from stoker.torch import DataLoader

DATA = list(range(100))


def _loader(sampler_cls, num_workers: int) -> DataLoader:
    return DataLoader(DATA, batch_size=1, sampler=sampler_cls(DATA), num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("interrupt", [0, 10, 50, 99])
@pytest.mark.parametrize(
    "sampler_cls",
    [torch.utils.data.RandomSampler, torch.utils.data.SequentialSampler],
    ids=["random", "sequential"],
)
def test_a_sampler_drawing_from_torchs_global_generator_resumes_after_reseeding(
    sampler_cls, num_workers, interrupt
) -> None:
    """torch.manual_seed(0) before each loader; torch's RandomSampler without a generator
    draws its seed from the global generator when the epoch starts. The resumed loader makes
    the same global draws as the interrupted one, so its sampler gives the same order."""
    torch.manual_seed(0)
    expected = [b.item() for b in _loader(sampler_cls, num_workers)]
    torch.manual_seed(0)
    first = _loader(sampler_cls, num_workers)
    head = []
    for i, batch in enumerate(first):
        head.append(batch.item())
        if i == interrupt:
            break
    state = first.state_dict()
    first.close()
    torch.manual_seed(0)
    resumed = _loader(sampler_cls, num_workers)
    resumed.load_state_dict(state)
    assert head + [b.item() for b in resumed] == expected


def test_a_state_taken_before_the_first_batch_pins_torchs_seed() -> None:
    """The base seed drawn from torch's global generator for a state taken before the epoch
    starts is the one the epoch then uses: the resumed random draws equal the run's."""

    class Draws(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int):
            return torch.rand(())

    torch.manual_seed(3)
    expected = [b.tolist() for b in DataLoader(Draws(), batch_size=4, shuffle=True)]
    torch.manual_seed(3)
    loader = DataLoader(Draws(), batch_size=4, shuffle=True)
    state = loader.state_dict()
    torch.manual_seed(99)
    resumed = DataLoader(Draws(), batch_size=4, shuffle=True)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == expected
    assert [b.tolist() for b in loader] == expected


@pytest.mark.parametrize("own_generator", [False, True], ids=["global", "own-generator"])
@pytest.mark.parametrize("stop", [(1, 3), (2, 0), (2, 7)], ids=["1-3", "2-0", "2-7"])
def test_torchs_random_sampler_resumes_in_a_later_epoch(own_generator, stop) -> None:
    """torch's RandomSampler keeps no state: each epoch's order comes from where the global
    generator, or its own, stood when the epoch started. The loader records those states
    and replays the resumed epoch's sampler under them."""
    epoch_stop, batches_stop = stop

    def make():
        generator = torch.Generator().manual_seed(4) if own_generator else None
        sampler = torch.utils.data.RandomSampler(DATA, generator=generator)
        return DataLoader(DATA, batch_size=10, sampler=sampler)

    torch.manual_seed(0)
    reference = make()
    expected = [[b.tolist() for b in reference] for _ in range(3)]
    torch.manual_seed(0)
    first = make()
    head = []
    for epoch in range(epoch_stop + 1):
        iterator = iter(first)
        for _ in range(batches_stop if epoch == epoch_stop else 10):
            head.append(next(iterator).tolist())
        if epoch < epoch_stop:
            assert next(iterator, None) is None
    state = first.state_dict()
    torch.manual_seed(123)  # the resumed process stands elsewhere
    resumed = make()
    resumed.load_state_dict(state)
    tail = [b.tolist() for _ in range(epoch_stop, 3) for b in resumed]
    assert head + tail == [b for epoch in expected for b in epoch]
