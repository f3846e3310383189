"""Hugging Face accelerate: ``prepare`` in one and two processes, ``skip_first_batches``,
gradient accumulation that sees the end of the data, ``gather_for_metrics``.

The two-process job runs under a real torchrun once with torch's loader and once with
stoker's, and every rank's batches are compared: the same shards in the same order (plus
stoker's guarantees: a resumed epoch draws the same augmentations).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="accelerate trains torch models")
pytest.importorskip(
    "accelerate", reason="these tests drive stoker.torch through Hugging Face accelerate"
)
tud = torch.utils.data

from accelerate import Accelerator
from accelerate.data_loader import DataLoaderShard

import stoker.torch
from frameworks import accelerate_job as job
from frameworks.framework_harness import run_ranks

JOB = Path(job.__file__)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("accelerate")
    return {kind: run_ranks(JOB, tmp / kind, kind) for kind in ("stoker", "torch")}


def test_prepare_keeps_stokers_engine_in_every_rank(runs) -> None:
    for record in runs["stoker"]:
        assert record["engine"] == "stoker.torch._loader"
        assert record["resumed_engine"] == "stoker.torch._loader"
    assert all(r["engine"] == "torch.utils.data.dataloader" for r in runs["torch"])


def test_ranks_get_torchs_shards_disjoint_and_covering(runs) -> None:
    ours, theirs = runs["stoker"], runs["torch"]
    for rank in range(2):
        assert ours[rank]["len"] == theirs[rank]["len"] == 4
        assert [e["batches"] for e in ours[rank]["epochs"]] == [
            e["batches"] for e in theirs[rank]["epochs"]
        ]
    for epoch in range(2):
        seen = [i for rank in range(2) for b in ours[rank]["epochs"][epoch]["batches"] for i in b]
        assert sorted(set(seen)) == list(
            range(job.N)
        )  # every sample; accelerate pads the last step
        assert len(seen) == 32
    assert ours[0]["epochs"][0]["batches"] != ours[0]["epochs"][1]["batches"]


def test_batches_hold_torch_types(runs) -> None:
    """Prepared batches and the batches after ``skip_first_batches`` are torch tensors with
    the dtypes torch's loader gives, in every epoch and rank."""
    expected = [
        "index:torch.Tensor:torch.int64",
        "noise:torch.Tensor:torch.float32",
        "x:torch.Tensor:torch.float32",
        "y:torch.Tensor:torch.int64",
    ]
    for kind in ("stoker", "torch"):
        for record in runs[kind]:
            assert [e["types"] for e in record["epochs"]] == [expected] * 2, kind
            assert record["resumed_types"] == expected, kind


def test_gradient_accumulation_sees_the_end_of_the_data(runs) -> None:
    """4 batches, accumulation over 3: the last, partial step must sync too."""
    for kind in ("stoker", "torch"):
        for record in runs[kind]:
            assert [e["sync"] for e in record["epochs"]] == [[False, False, True, True]] * 2, kind


def test_gather_for_metrics_returns_the_dataset_once(runs) -> None:
    for kind in ("stoker", "torch"):
        for record in runs[kind]:
            for epoch in record["epochs"]:
                assert sorted(epoch["gathered"]) == list(range(job.N)), kind


def test_skip_first_batches_resumes_the_epoch_exactly(runs) -> None:
    for kind in ("stoker", "torch"):
        for record in runs[kind]:
            assert record["resumed_len"] == 4 - job.SKIP
            assert record["resumed"] == record["epochs"][0]["batches"][job.SKIP :], kind
    # stoker's guarantee on top: the resumed samples draw the augmentations they drew
    for record in runs["stoker"]:
        assert record["resumed_noise"] == record["epochs"][0]["noise"][job.SKIP :]
    assert any(r["resumed_noise"] != r["epochs"][0]["noise"][job.SKIP :] for r in runs["torch"])


def test_prepare_in_one_process_wraps_a_stoker_loader() -> None:
    accelerator = Accelerator(cpu=True)
    loader = stoker.torch.DataLoader(
        job.Indexed(), batch_size=4, worker_mode="thread", num_workers=2, on_error="skip"
    )
    prepared = accelerator.prepare(loader)
    assert isinstance(prepared, DataLoaderShard) and isinstance(prepared, stoker.torch.DataLoader)
    inner = prepared.base_dataloader
    assert type(inner) is stoker.torch.DataLoader
    assert (inner.worker_mode, inner.on_error, inner.num_workers) == ("thread", "skip", 2)
    batches = [b["index"].tolist() for b in prepared]
    assert batches == [list(range(i, min(i + 4, job.N))) for i in range(0, job.N, 4)]
    skipped = accelerator.skip_first_batches(prepared, 3)
    assert [b["index"].tolist() for b in skipped] == batches[3:]
    assert type(skipped.base_dataloader) is stoker.torch.DataLoader


def test_ranks_draw_different_augmentations_for_their_different_samples(runs) -> None:
    """Both ranks share the seed; the k-th sample of each rank is a different sample, and with
    stoker it draws differently. torch's workers start from the same seed on every rank."""
    ours = [r["epochs"][0]["noise"] for r in runs["stoker"]]
    theirs = [r["epochs"][0]["noise"] for r in runs["torch"]]
    assert ours[0] != ours[1]
    assert theirs[0] == theirs[1]
