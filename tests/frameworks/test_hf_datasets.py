"""Hugging Face ``datasets.Dataset`` (Arrow-backed, memory-mapped) through stoker.torch and
through torch's loader, in its plain, numpy and torch formats, with and without workers.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the oracle is torch.utils.data.DataLoader")
datasets = pytest.importorskip("datasets", reason="these tests load Hugging Face datasets")
tud = torch.utils.data

import stoker.torch

ROWS = 203


def pad_batch(rows: list[dict]) -> dict:
    """Pads ``input_ids`` to the longest row; works on lists, numpy arrays and tensors."""
    ids = [torch.as_tensor(r["input_ids"], dtype=torch.int64) for r in rows]
    width = max(len(t) for t in ids)
    padded = torch.zeros(len(ids), width, dtype=torch.int64)
    for row, t in zip(padded, ids, strict=True):
        row[: len(t)] = t
    labels = torch.as_tensor([int(r["label"]) for r in rows])
    return {"input_ids": padded, "lengths": torch.as_tensor([len(t) for t in ids]), "label": labels}


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> datasets.Dataset:
    """A dataset saved to disk and loaded back, so its Arrow data is memory-mapped."""
    lengths = [(i * 37) % 23 + 1 for i in range(ROWS)]
    data = {
        "input_ids": [list(range(i, i + n)) for i, n in enumerate(lengths)],
        "label": [i % 5 for i in range(ROWS)],
    }
    path = tmp_path_factory.mktemp("hf") / "table"
    datasets.Dataset.from_dict(data).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


@pytest.mark.parametrize("fmt", [None, "numpy", "torch"], ids=["plain", "numpy", "torch"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_hf_dataset_batches_equal_torchs(table, fmt, num_workers) -> None:
    dataset = table.with_format(fmt)
    batches = {}
    for name, cls in (("torch", tud.DataLoader), ("stoker", stoker.torch.DataLoader)):
        loader = cls(
            dataset, batch_size=16, shuffle=True, collate_fn=pad_batch, num_workers=num_workers,
            generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
        batches[name] = [list(loader) for _ in range(2)]
    for ours, theirs in zip(batches["stoker"], batches["torch"], strict=True):
        assert len(ours) == len(theirs) == -(-ROWS // 16)
        for a, b in zip(ours, theirs, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), key
    first = [int(i) for b in batches["stoker"][0] for i in b["input_ids"][:, 0]]
    assert sorted(first) == list(range(ROWS))  # every row once (row i starts with i)
    assert (
        batches["stoker"][0][0]["input_ids"].tolist()
        != batches["stoker"][1][0]["input_ids"].tolist()
    )


def test_hf_dataset_with_stokers_default_collate_gives_torchs_tensors(table) -> None:
    """Fixed-width columns collate by default, into the types torch's loader returns."""
    dataset = table.select_columns(["label"]).with_format("numpy")
    ours = list(stoker.torch.DataLoader(dataset, batch_size=50, num_workers=2))
    theirs = list(tud.DataLoader(dataset, batch_size=50))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert type(a["label"]) is type(b["label"]) is torch.Tensor
        assert a["label"].dtype == b["label"].dtype and torch.equal(a["label"], b["label"])
