"""Large Python containers on a dataset: named before process workers copy them, or compacted."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stoker import DataLoader, Subset
from stoker.compact import RecordArray, StringArray
from stoker.profiling.copy_on_read import MIN_BYTES, find_large_containers

N = 300_000  # ~30 MiB of short strings: above the warning threshold


def paths(n: int = N) -> list[str]:
    return [f"/data/train/class_{i % 10}/image_{i:08d}.jpg" for i in range(n)]


class Paths:
    def __init__(self, items) -> None:
        self.items = items

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        return len(self.items[i])


def start_workers(loader: DataLoader) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b.tolist() for b in loader]
    assert sum(len(b) for b in batches) == 64
    return [str(w.message) for w in caught if "Python objects" in str(w.message)]


def test_a_list_of_paths_is_named_with_its_cost_and_the_fix() -> None:
    dataset = Paths(paths())
    [message] = start_workers(
        DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork")
    )
    found = find_large_containers(dataset)[0]
    mib = f"{found.nbytes / 2**20:,.0f}"
    assert message == (
        f"DataLoader: dataset.items is a list of str with 300,000 items (about {mib} MiB of "
        "Python objects). Forked workers copy the memory of every Python object they read "
        f"(reading writes its reference count), so each worker can grow by up to about {mib} MiB "
        "over an epoch. Keep it compact: `self.items = stoker.compact(self.items)` in the "
        "dataset's __init__ (one buffer the workers share), or pass compact_dataset=True to let "
        "the loader do it. See docs/memory.md."
    )
    real = sum(len(p) + 49 for p in dataset.items) + 8 * N  # str objects and list pointers
    assert 0.8 < found.nbytes / real < 1.25, "the estimate is far from the objects' real size"


def test_spawn_workers_are_told_each_holds_a_copy() -> None:
    [message] = start_workers(
        DataLoader(Paths(paths()), batch_size=16, num_workers=1, multiprocessing_context="spawn")
    )
    assert "Each spawn worker unpickles its own copy: about " in message


def test_a_wrapped_dataset_and_a_dict_of_records_are_found() -> None:
    table = {i: {"path": f"/x/{i}.jpg", "label": i % 7} for i in range(N)}
    dataset = Subset(Paths(table), range(64))
    [message] = start_workers(DataLoader(dataset, batch_size=16, num_workers=2))
    assert message.startswith(
        "DataLoader: dataset.dataset.items is a dict of dict with 300,000 items"
    )
    assert (
        "Keep it in numpy arrays or stoker.compact containers (StringArray, RecordArray)" in message
    )


@pytest.mark.parametrize(
    "items",
    [
        StringArray(paths()),
        np.zeros((N, 8)),
        paths(10_000),  # small: under the threshold
    ],
    ids=["StringArray", "ndarray", "small list"],
)
def test_what_workers_share_or_what_is_small_is_not_warned_about(items) -> None:
    assert start_workers(DataLoader(Paths(items), batch_size=16, num_workers=2)) == []


def test_thread_workers_share_the_trainers_objects_and_are_not_warned() -> None:
    assert (
        start_workers(
            DataLoader(Paths(paths()), batch_size=16, num_workers=2, worker_mode="thread")
        )
        == []
    )


def test_compact_dataset_replaces_lists_and_keeps_every_batch() -> None:
    plain = Paths(paths())
    expected = [b.tolist() for b in DataLoader(plain, batch_size=16)]
    records = Paths([(p, i) for i, p in enumerate(paths())])
    for dataset, kind in ((Paths(paths()), StringArray), (records, RecordArray)):
        loader = DataLoader(dataset, batch_size=16, num_workers=2, compact_dataset=True)
        assert start_workers(loader) == []  # compacted, so nothing to warn about
        assert type(dataset.items) is kind
        if kind is StringArray:
            assert [b.tolist() for b in loader] == expected
            assert list(dataset.items[:3]) == paths(3)


def test_the_walk_is_bounded_in_time_and_depth() -> None:
    class Deep:
        def __init__(self, depth: int) -> None:
            self.child = Deep(depth - 1) if depth else None
            self.items = paths() if depth == 0 else None

    assert find_large_containers(Deep(5)) == []  # five levels down: not walked
    assert [f.where for f in find_large_containers(Deep(2))] == ["dataset.child.child.items"]
    assert find_large_containers(Paths(paths()), budget_s=0.0) == []
    assert MIN_BYTES == 16 * 2**20


def test_the_gc_freeze_measurement_is_where_the_docstring_says() -> None:
    import re
    from pathlib import Path

    import stoker.profiling.copy_on_read as module

    root = Path(__file__).resolve().parents[2]
    doc = module.__doc__ or ""
    cited = re.findall(r"\b(docs/[\w.-]+\.md|BENCHMARKS\.md|benchmarks/[\w.-]+\.py)\b", doc)
    assert cited, "the docstring names where gc.freeze() was measured"
    for name in cited:  # each place it names exists and records the gc.freeze() measurement
        assert "gc.freeze()" in (root / name).read_text(encoding="utf-8"), name
