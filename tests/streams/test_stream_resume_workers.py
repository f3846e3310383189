"""Mid-epoch resume of a stream read by process workers: exactly the rest of the epoch.

Each worker reads its own shard; every batch it sends carries its stream's state after
that batch, and ``loader.state_dict()`` keeps, per worker, the state after the last batch
*you received* (not the ones it loaded ahead), plus whose batch comes next.
"""

from __future__ import annotations

import numpy as np
import pytest

from stoker import DataLoader
from stoker.formats.text import JsonLines
from streams.test_stream_shuffle import write_corpus


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def noisy(record):
    """An augmentation drawing from the global generator: per-sample seeded by stoker."""
    return {"key": (record["f"], record["i"]), "noise": float(np.random.rand())}


def loader_over(folder, **options) -> DataLoader:
    stream = JsonLines(folder, shuffle_buffer=8, shuffle_files=True, seed=3, transform=noisy)
    options.setdefault("num_workers", 2)
    return DataLoader(stream, batch_size=4, collate_fn=list, generator=11, **options)


def flat(batches) -> list[tuple[tuple[int, int], float]]:
    return [(tuple(r["key"]), r["noise"]) for batch in batches for r in batch]


@pytest.mark.parametrize(
    ("num_workers", "persistent_workers"),
    [(0, False), (2, False), (2, True)],
    ids=["main", "2", "2-persistent"],
)
@pytest.mark.parametrize("stop_after", [1, 3, 6, 9])
def test_a_resumed_epoch_delivers_exactly_the_rest(
    tmp_path, stop_after, num_workers, persistent_workers
) -> None:
    keys = write_corpus(str(tmp_path))
    options = {"num_workers": num_workers, "persistent_workers": persistent_workers}
    whole = flat(loader_over(str(tmp_path), **options))
    assert sorted(k for k, _ in whole) == sorted(keys)  # every record once
    assert len({noise for _, noise in whole}) == len(whole)  # every sample drew its own

    first = loader_over(str(tmp_path), **options)
    it = iter(first)
    head = flat(next(it) for _ in range(stop_after))
    state = first.state_dict()
    first.close()
    if num_workers:
        assert set(state["workers"]) == {"num_workers", "streams", "next"}
        assert state["workers"]["num_workers"] == 2 and set(state["workers"]["streams"]) <= {0, 1}
    else:
        assert "workers" not in state and state["stream"]["dataset"]["kind"] == "stoker.stream"

    resumed = loader_over(str(tmp_path), **options)
    resumed.load_state_dict(state)
    rest = flat(resumed)
    resumed.close()
    assert head + rest == whole  # the same samples, order and augmentations


def state_after_one_batch(folder: str) -> dict:
    loader = loader_over(folder)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    return state


def test_the_state_holds_positions_not_data(tmp_path) -> None:
    write_corpus(str(tmp_path))
    state = state_after_one_batch(str(tmp_path))
    text = repr(state["workers"])
    assert '"noise"' not in text and "'noise'" not in text  # no sample is stored
    assert len(text) < 2000


def test_a_different_worker_count_is_refused_with_the_numbers(tmp_path) -> None:
    write_corpus(str(tmp_path))
    state = state_after_one_batch(str(tmp_path))
    other = loader_over(str(tmp_path), num_workers=1)
    other.load_state_dict(state)
    with pytest.raises(ValueError) as info:
        next(iter(other))
    assert str(info.value) == (
        "this state was saved mid-epoch by a loader with num_workers=2, and this one has "
        "num_workers=1: each worker of an IterableDataset reads its own shard of the stream, so a "
        "stream resumes only with the same number of workers (or with 0 and 1 workers, which "
        "read the same single shard). Pass num_workers=2, or save at an epoch boundary to "
        "change it."
    )


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 1), (1, 0)], ids=["0-to-1", "1-to-0"])
@pytest.mark.parametrize("stop_after", [0, 2, 7])
def test_a_stream_moves_between_0_and_1_workers_mid_epoch(
    tmp_path, saved_with, resumed_with, stop_after
) -> None:
    write_corpus(str(tmp_path))
    whole = flat(loader_over(str(tmp_path), num_workers=saved_with))
    assert whole == flat(loader_over(str(tmp_path), num_workers=resumed_with))  # one shard

    first = loader_over(str(tmp_path), num_workers=saved_with)
    it = iter(first)
    head = flat(next(it) for _ in range(stop_after))
    state = first.state_dict()
    first.close()
    resumed = loader_over(str(tmp_path), num_workers=resumed_with)
    resumed.load_state_dict(state)
    rest = flat(resumed)
    resumed.close()
    assert len(rest) == len(whole) - len(head)
    assert head + rest == whole  # the same samples, order and augmentations


def test_thread_workers_cannot_save_a_mid_epoch_stream_state(tmp_path) -> None:
    write_corpus(str(tmp_path))
    loader = loader_over(str(tmp_path), worker_mode="thread")
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="its 2 thread workers share one JsonLines object"):
        loader.state_dict()
    it.close()


def test_an_epoch_boundary_state_starts_the_next_epoch(tmp_path) -> None:
    write_corpus(str(tmp_path))
    loader = loader_over(str(tmp_path))
    list(loader)
    state = loader.state_dict()
    assert "workers" not in state and state["batches"] == 0
    second = flat(loader)
    resumed = loader_over(str(tmp_path))
    resumed.load_state_dict(state)
    assert flat(resumed) == second
