"""How a process worker hands its batches back: without waiting for the trainer, without copies.

Each behaviour is checked on a plain dataset and on a Hugging Face ``datasets.Dataset``
(memory-mapped Arrow), the kind of dataset whose short batches made both costs show.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest

from engine.engine_datasets import BigAnswers, LogBatches, Tensors
from stoker import DataLoader, PadCollate, _proc

_WAIT_S = 10.0
_TEXT = 256 * 1024  # characters per sample: two of them are more than a pipe holds


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _arrow(tmp_path: Any, columns: dict) -> Any:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    folder = str(tmp_path / "arrow")
    datasets.Dataset.from_dict(columns).save_to_disk(folder)
    return datasets.load_from_disk(folder)


def _big_answers(tmp_path: Any, log: str, kind: str) -> Any:
    if kind == "plain":
        return BigAnswers(8, log, size=_TEXT)
    dataset = _arrow(tmp_path, {"idx": list(range(8)), "text": ["x" * _TEXT] * 8})
    return dataset.with_transform(LogBatches(log))


def _ids(batch: Any) -> list[int]:
    return [int(i) for i in (batch[0] if isinstance(batch, list) else batch["idx"])]


@pytest.mark.parametrize("kind", ["plain", "arrow"])
def test_a_worker_loads_its_next_batch_before_the_trainer_reads_its_last(tmp_path, kind) -> None:
    """The worker loop queues its answer and goes on: it never waits on the pipe.

    Each answer here (two samples of 256 KiB of text, pickled inline) is bigger than a
    pipe holds, so its write cannot finish until the trainer reads. The trainer has sent
    two tasks and reads nothing: the second batch must still be loaded.
    """
    log = str(tmp_path / "fetched")
    loader = DataLoader(
        _big_answers(tmp_path, log, kind), batch_size=2, num_workers=1, prefetch_factor=2
    )
    it = iter(loader)
    it.start()  # starts the epoch: dispatches the worker's first two tasks, reads nothing
    deadline = time.monotonic() + _WAIT_S
    while len(_lines(log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _lines(log) == ["0 1", "2 3"]
    batches = list(it)
    assert [_ids(b) for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    loader.close()


def _tensor_batches(tmp_path: Any, kind: str) -> tuple[DataLoader, Any]:
    """Batches of tensors that collate writes into the slot (256 KiB each)."""
    if kind == "plain":
        return DataLoader(Tensors(96, 16384), batch_size=4, num_workers=2), lambda b: b
    rows = 96
    dataset = _arrow(
        tmp_path, {"idx": list(range(rows)), "input_ids": [[i] * 8192 for i in range(rows)]}
    )
    loader = DataLoader(
        dataset.with_format("torch"), batch_size=4, num_workers=2, collate_fn=PadCollate(0)
    )
    return loader, lambda b: b["input_ids"]


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["plain", "arrow"])
def test_tensors_collated_into_a_slot_arrive_as_views_of_the_slot(tmp_path, kind) -> None:
    """A tensor batch that collate wrote into its slot travels as a reference to it.

    Encoding looked the tensor's array up by object identity, missed (``tensor.numpy()``
    is a new object each time), found no room for a second copy and pickled the whole
    batch into the pipe instead.
    """
    pytest.importorskip("torch")
    loader, tensor_of = _tensor_batches(tmp_path, kind)
    seen, in_shm = [], []
    for batch in loader:
        tensor = tensor_of(batch)
        assert bool((tensor == tensor[:, :1]).all())
        seen += tensor[:, 0].tolist()
        in_shm.append(os.path.basename(_proc.mapped_file(tensor.data_ptr())).startswith("stoker-"))
    np.testing.assert_array_equal(np.asarray(seen), np.arange(96))
    assert all(in_shm[4:])  # the first few travel before the slot pool exists


@pytest.mark.torch
def test_small_tensors_travel_inline_as_arrays_and_keep_what_matters() -> None:
    """Tensors under the inline size go through the pickle as numpy arrays (torch's own
    pickling costs ~35 us a tensor at each end); those numpy cannot carry still pickle
    as themselves."""
    torch = pytest.importorskip("torch")
    from stoker.engine import transport
    from stoker.engine.messages import Done

    batch = {
        "label": torch.arange(8),
        "every_other": torch.arange(16)[::2],
        "half": torch.ones(4, dtype=torch.bfloat16),
        "grad": torch.ones(3, requires_grad=True),
        "array": np.arange(3),
    }
    message, leased = transport.decode(transport.encode(Done(0, 0, 0, batch, 0, 0), None), None)
    out = message.batch
    assert leased == set()
    for key in ("label", "every_other", "half", "grad"):
        assert isinstance(out[key], torch.Tensor) and out[key].dtype == batch[key].dtype
        assert torch.equal(out[key].detach(), batch[key].detach())
    assert out["grad"].requires_grad and not out["label"].requires_grad
    out["label"] += 1  # writable, like any batch
    np.testing.assert_array_equal(out["array"], [0, 1, 2])
