"""Hugging Face ``datasets.Dataset`` (memory-mapped Arrow) through stoker's process workers.

Real ``datasets`` objects, written to disk and read back as a Hub or ``.map()`` dataset
is, in the python, numpy and torch formats. Row ``i`` holds ``input_ids = [i + 1] * n_i``
(so a padded row says which row it is and how long it was), a label and ``idx = i``.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.save_load import run_test_save_load_state, to_plain
from stoker import DataLoader, PadCollate

datasets = pytest.importorskip("datasets")

ROWS = 203  # not a multiple of the batch size: the last batch is short
FORMATS = [
    "python",
    "numpy",
    pytest.param("torch", marks=pytest.mark.torch),
]


def _lengths(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(1, 40, size=n)


@pytest.fixture(scope="module")
def arrow_dataset(tmp_path_factory):
    """The token dataset, memory-mapped from an Arrow file on disk."""
    lengths = _lengths(ROWS)
    data = {
        "input_ids": [[i + 1] * int(n) for i, n in enumerate(lengths)],
        "label": [i % 3 for i in range(ROWS)],
        "idx": list(range(ROWS)),
    }
    folder = str(tmp_path_factory.mktemp("hf") / "tokens")
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(data).save_to_disk(folder)
    return datasets.load_from_disk(folder)


def formatted(dataset, fmt: str):
    if fmt == "torch":
        pytest.importorskip("torch")
    return dataset if fmt == "python" else dataset.with_format(fmt)


def check_rows(batch: dict) -> list[int]:
    """Asserts that every padded row holds its own tokens; returns the rows' idx."""
    ids = np.asarray(batch["input_ids"])
    idx = np.asarray(batch["idx"]).tolist()
    lengths = _lengths(ROWS)[idx]
    assert np.asarray(batch["lengths"]).tolist() == lengths.tolist()
    for row, i, n in zip(ids, idx, lengths, strict=True):
        assert row[:n].tolist() == [i + 1] * n and not row[n:].any()
    assert np.asarray(batch["label"]).tolist() == [i % 3 for i in idx]
    return idx


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_row_arrives_once_and_padded_from_process_workers(arrow_dataset, fmt) -> None:
    loader = DataLoader(
        formatted(arrow_dataset, fmt),
        batch_size=16,
        shuffle=True,
        generator=5,
        num_workers=2,
        collate_fn=PadCollate(0),
    )
    for _epoch in range(2):
        seen = [i for batch in loader for i in check_rows(batch)]
        assert sorted(seen) == list(range(ROWS))
    loader.close()


@pytest.mark.torch
def test_torch_format_batches_are_tensors_through_stoker_torch(arrow_dataset) -> None:
    torch = pytest.importorskip("torch")
    import stoker.torch

    loader = stoker.torch.DataLoader(
        arrow_dataset.with_format("torch"), batch_size=16, num_workers=2, collate_fn=PadCollate(0)
    )
    batches = list(loader)
    assert all(isinstance(v, torch.Tensor) for b in batches for v in b.values())
    assert batches[0]["input_ids"].dtype == torch.int64
    assert batches[0]["attention_mask"].dtype == torch.bool
    assert sorted(i for b in batches for i in check_rows(b)) == list(range(ROWS))


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_batches_for_the_same_seed_whatever_the_workers(arrow_dataset, fmt) -> None:
    dataset = formatted(arrow_dataset, fmt)

    def epochs(**workers) -> list:
        loader = DataLoader(
            dataset, batch_size=16, shuffle=True, generator=9, collate_fn=PadCollate(0), **workers
        )
        out = [to_plain(b) for _ in range(2) for b in loader]
        loader.close()
        return out

    alone = epochs()
    assert epochs(num_workers=2) == alone
    assert epochs(num_workers=3, in_order=True, prefetch_factor=1) == alone
    assert epochs(num_workers=2, worker_mode="thread") == alone


@pytest.mark.parametrize("stop_at", [3, 13, 17])  # 13 batches per epoch
def test_resume_mid_epoch_with_another_worker_count(arrow_dataset, stop_at) -> None:
    dataset = arrow_dataset.with_format("numpy")

    def make(resumed: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=16,
            shuffle=True,
            generator=1,
            collate_fn=PadCollate(0),
            num_workers=0 if resumed else 2,
        )

    run_test_save_load_state(make, stop_at=stop_at, epochs=2)


def fail_on_row_13(batch: dict) -> dict:
    """A formatting transform that breaks on one row, as a bad record would."""
    if 13 in batch["idx"]:
        raise ValueError("row 13 is corrupt")
    return batch


def test_an_error_in_a_worker_names_the_indices_of_its_batch(arrow_dataset) -> None:
    dataset = arrow_dataset.with_transform(fail_on_row_13)
    loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=PadCollate(0))
    it = iter(loader)
    assert check_rows(next(it)) == list(range(8))
    with pytest.raises(ValueError, match="row 13 is corrupt") as caught:
        next(it)
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "while loading indices [8, 9, 10, 11, 12, 13, 14, 15]" in note
    assert check_rows(next(it)) == list(range(16, 24))  # the iterator goes on
    loader.close()
