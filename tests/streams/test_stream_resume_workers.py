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


def head_and_state(folder: str, batches: int, **options) -> tuple[list, dict]:
    """The first ``batches`` batches of an epoch, and the loader's state after them."""
    loader = loader_over(folder, **options)
    it = iter(loader)
    head = flat(next(it) for _ in range(batches))
    state = loader.state_dict()
    loader.close()
    return head, state


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

    head, state = head_and_state(str(tmp_path), stop_after, **options)
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
    return head_and_state(folder, 1)[1]


def test_the_state_holds_positions_not_data(tmp_path) -> None:
    write_corpus(str(tmp_path))
    state = state_after_one_batch(str(tmp_path))
    text = repr(state["workers"])
    assert '"noise"' not in text and "'noise'" not in text  # no sample is stored
    assert len(text) < 2000


@pytest.mark.parametrize(
    "counts",
    [(2, 3, 1), (2, 0, 2), (1, 2, 3), (3, 2, 2), (0, 3, 1)],
    ids=lambda c: "-".join(map(str, c)),
)
@pytest.mark.parametrize("stop_after", [1, 5])
def test_a_reader_resumes_with_other_worker_counts_delivering_each_record_once(
    tmp_path, counts, stop_after
) -> None:
    """Saved with W workers, resumed with W' (then saved again and resumed with W''): the
    records delivered before are skipped, every other one comes once."""
    keys = write_corpus(str(tmp_path))
    first_count, second_count, third_count = counts
    got, state = head_and_state(str(tmp_path), stop_after, num_workers=first_count)
    second = loader_over(str(tmp_path), num_workers=second_count)
    second.load_state_dict(state)
    it = iter(second)
    got += flat([next(it)])
    notes = second.stats().notes
    state = second.state_dict()
    second.close()
    third = loader_over(str(tmp_path), num_workers=third_count)
    third.load_state_dict(state)
    got += flat(third)
    third.close()
    delivered = [k for k, _ in got]
    assert sorted(delivered) == sorted(keys), "a record was lost or delivered twice"
    assert any(
        f"saved by a loader with num_workers={first_count}, and this one has {second_count}: "
        "the records its streams delivered are skipped" in note
        for note in notes
    ), notes
    assert flat(loader_over(str(tmp_path), num_workers=third_count))  # the next epoch is whole


def test_a_damaged_regrouped_state_is_refused_naming_the_entry(tmp_path) -> None:
    write_corpus(str(tmp_path))
    state = state_after_one_batch(str(tmp_path))
    other = loader_over(str(tmp_path), num_workers=3)
    other.load_state_dict(state)
    it = iter(other)
    next(it)
    saved = other.state_dict()
    other.close()
    stream = saved["workers"]["streams"][0]["dataset"]
    assert stream["delivered"], "the regrouped state lost its marks"
    stream["delivered"][0]["read"] = [99, 0]
    damaged = loader_over(str(tmp_path), num_workers=3)
    damaged.load_state_dict(saved)
    with pytest.raises(ValueError) as info:
        list(damaged)
    damaged.close()
    assert "JsonLines.load_state_dict: state['delivered'][0]['read'] must be [file, record]" in str(
        info.value
    )


def test_a_stream_that_cannot_regroup_is_refused_with_the_numbers(tmp_path) -> None:
    from stoker import IterableDataset

    class Counting(IterableDataset):
        def __init__(self) -> None:
            self.start = 0

        def __iter__(self):
            from stoker import get_worker_info

            info = get_worker_info()
            return iter(range(self.start + info.id, 40, info.num_workers))

        def state_dict(self):
            return {"start": self.start}

        def load_state_dict(self, state):
            self.start = state["start"]

    loader = DataLoader(Counting(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    other = DataLoader(Counting(), batch_size=4, num_workers=1)
    other.load_state_dict(state)
    with pytest.raises(ValueError) as info:
        next(iter(other))
    assert str(info.value) == (
        "this state was saved mid-epoch by a loader with num_workers=2, and this one has "
        "num_workers=1: each worker of an IterableDataset reads its own shard of the stream, "
        "and Counting cannot say which records each shard delivered, so it resumes only with "
        "the same number of workers (or with 0 and 1 workers, which read the same single "
        "shard). Pass num_workers=2, or save at an epoch boundary to change it; stoker's file "
        "readers (TextLines, JsonLines, TarShards) resume with any number."
    )


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 1), (1, 0)], ids=["0-to-1", "1-to-0"])
@pytest.mark.parametrize("stop_after", [0, 2, 7])
def test_a_stream_moves_between_0_and_1_workers_mid_epoch(
    tmp_path, saved_with, resumed_with, stop_after
) -> None:
    write_corpus(str(tmp_path))
    whole = flat(loader_over(str(tmp_path), num_workers=saved_with))
    assert whole == flat(loader_over(str(tmp_path), num_workers=resumed_with))  # one shard

    head, state = head_and_state(str(tmp_path), stop_after, num_workers=saved_with)
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
