"""PyTorch Lightning: single-device fit / validate / predict, two-process DDP on CPU with
sampler injection, the prediction writer's batch indices, and a mid-epoch checkpoint resume.

Each test runs the same Lightning code with torch's loader and with stoker's and compares:
"behaves like torch, plus stoker's guarantees".
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="Lightning trains torch models")
L = pytest.importorskip(
    "lightning", reason="these tests drive stoker.torch through PyTorch Lightning"
)
tud = torch.utils.data

from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint

import stoker.torch
from frameworks import lightning_job as job
from frameworks.framework_harness import framework_env, run_job

pytestmark = [
    # Lightning's advice about worker counts, logging and dataloader sizes is not the subject here
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),  # Lightning on torch 2.13
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*GPU available.*"),
]
KINDS = ("stoker", "torch")


def trainer(**options) -> L.Trainer:
    defaults = {
        "accelerator": "cpu", "devices": 1, "max_epochs": 2, "logger": False,
        "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
    }  # fmt: skip
    return L.Trainer(**{**defaults, **options})


def steps(seen: list) -> list:
    """(epoch, indices) of every recorded step."""
    return [(epoch, indices) for epoch, indices, _ in seen]


# ------------------------------------------------------------------ two processes


@pytest.fixture(
    scope="module", params=[("ddp", "hook"), ("ddp_spawn", "argument")], ids=lambda p: "-".join(p)
)
def ddp(request, tmp_path_factory) -> dict[str, list[dict]]:
    strategy, source = request.param
    tmp = tmp_path_factory.mktemp(f"lightning-{strategy}")
    return {kind: run_two_ranks(tmp / kind, kind, strategy, source) for kind in KINDS}


def run_two_ranks(out: Path, kind: str, *args: str) -> list[dict]:
    """Runs ``lightning_job.py OUT kind *args`` (Lightning starts the second rank); each rank's
    JSON."""
    out.mkdir()
    run_job([sys.executable, job.__file__, str(out), kind, *args], framework_env(), cwd=out.parent)
    return [json.loads((out / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(2)]


def test_ddp_injects_a_distributed_sampler_into_a_stoker_loader(ddp) -> None:
    for record in ddp["stoker"]:
        assert record["loader"] == "stoker.torch._loader.DataLoader"
        assert record["sampler"] == "DistributedSampler"


def test_ddp_ranks_are_disjoint_cover_the_data_and_match_torch(ddp) -> None:
    ours, theirs = ddp["stoker"], ddp["torch"]
    for rank in range(2):
        assert steps(ours[rank]["seen"]) == steps(theirs[rank]["seen"])
    for epoch in range(job.EPOCHS):
        per_rank = [{i for e, b, _ in r["seen"] if e == epoch for i in b} for r in ours]
        assert len(per_rank[0]) == len(per_rank[1]) == job.N // 2
        assert not per_rank[0] & per_rank[1]
        assert per_rank[0] | per_rank[1] == set(range(job.N))


def test_ddp_epochs_differ(ddp) -> None:
    for record in ddp["stoker"]:
        by_epoch = [[b for e, b, _ in record["seen"] if e == epoch] for epoch in range(job.EPOCHS)]
        assert by_epoch[0] != by_epoch[1]


def test_ddp_mid_epoch_checkpoint_resumes_each_rank_exactly(tmp_path) -> None:
    """Two ranks stopped after 1 of epoch 1's 3 steps: resumed from that checkpoint in a new
    trainer, each rank trains on exactly the batches, with the same augmentations, that
    the uninterrupted run trained on after that step.

    Lightning saves rank 0's loader state in the checkpoint and loads it into every rank.
    stoker's state is the epoch, the batches delivered and the base seed, which ranks share
    (they seed alike), so it is right for rank 1 too. torch's loader has no state: Lightning
    warns (on rank 0) and the loader starts over; with workers its sampler is read before
    Lightning sets the epoch, so each rank trains on the first 2 batches of its *epoch 0*
    shard, with epoch 0's augmentations, and the run ends with the rest never seen.
    """
    runs = {kind: run_two_ranks(tmp_path / kind, kind, "ddp", "hook", "resume") for kind in KINDS}
    done = job.STEPS_PER_EPOCH + 1  # the steps the checkpoint had trained
    for rank, (ours, theirs) in enumerate(zip(runs["stoker"], runs["torch"], strict=True)):
        assert ours["rank"] == rank and ours["loader"] == "stoker.torch._loader.DataLoader"
        assert ours["sampler"] == "DistributedSampler"
        assert steps(ours["full"]) == steps(theirs["full"])  # torch's shards, in torch's order
        assert len(ours["full"]) == job.EPOCHS * job.STEPS_PER_EPOCH
        assert ours["resumed"] == ours["full"][done:], f"rank {rank} did not resume exactly"
        assert not any("not resumable" in w for w in ours["resumed_warnings"])
        epoch_0 = theirs["full"][: job.STEPS_PER_EPOCH - 1]
        assert theirs["resumed"] == [[1, b, n] for _, b, n in epoch_0], f"rank {rank}"
    assert runs["stoker"][0]["resumed"] != runs["stoker"][1]["resumed"]
    assert any("not resumable" in w for w in runs["torch"][0]["resumed_warnings"])
    # what the checkpoint holds: one loader state (rank 0's), none for torch's loader
    states = {
        kind: torch.load(tmp_path / kind / "checkpoints" / job.RESUME_AT, weights_only=False)[
            "loops"
        ]["fit_loop"]["state_dict"].get("combined_loader")
        for kind in KINDS
    }
    assert states["torch"] is None
    [state] = states["stoker"]
    assert (state["epoch"], state["batches"]) == (1, 1)


# ------------------------------------------------------------------ one device, in process


def test_fit_validate_predict_on_one_device_match_torch() -> None:
    class Full(job.Recorder):
        def validation_step(self, batch, batch_idx):
            self.log("val", self.layer(batch["x"]).sum())

        def predict_step(self, batch, batch_idx):
            return batch["index"] * 2

    results = {}
    for kind in KINDS:
        torch.manual_seed(0)
        model = Full(kind, from_hook=False)
        loader = job.make_loader(kind, generator=torch.Generator().manual_seed(4))
        plain = (stoker.torch.DataLoader if kind == "stoker" else tud.DataLoader)(
            job.Indexed(), batch_size=5
        )
        run = trainer()
        run.fit(model, train_dataloaders=loader, val_dataloaders=plain)
        validated = run.validate(model, dataloaders=plain, verbose=False)
        predicted = run.predict(model, dataloaders=plain)
        results[kind] = (steps(model.seen), validated, [p.tolist() for p in predicted])
    assert results["stoker"] == results["torch"]
    epochs = results["stoker"][0]
    assert sorted(i for e, b in epochs if e == 0 for i in b) == list(range(job.N))
    assert [b for e, b in epochs if e == 0] != [b for e, b in epochs if e == 1]


def test_the_prediction_writer_receives_each_batchs_indices() -> None:
    class Writer(BasePredictionWriter):
        def __init__(self) -> None:
            super().__init__(write_interval="batch")
            self.indices: list[list[int]] = []

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, *args) -> None:
            assert prediction.tolist() == [2 * i for i in batch_indices]
            self.indices.append(list(batch_indices))

    class Predictor(job.Recorder):
        def predict_step(self, batch, batch_idx):
            return batch["index"] * 2

    written = {}
    for kind in KINDS:
        writer = Writer()
        loader = job.make_loader(kind, generator=torch.Generator().manual_seed(2))
        trainer(callbacks=[writer]).predict(
            Predictor(kind, from_hook=False), dataloaders=loader, return_predictions=False
        )
        written[kind] = writer.indices
    assert written["stoker"] == written["torch"]
    assert sorted(i for b in written["stoker"] for i in b) == list(range(job.N))


def test_a_mid_epoch_checkpoint_resumes_exactly(tmp_path) -> None:
    """Stopped after 2 of epoch 0's 6 steps, the resumed run trains on exactly the rest,
    with the same augmentations; torch's loader cannot resume mid-epoch."""
    steps_per_epoch = job.N // job.BATCH

    def fit(kind: str, ckpt: str | None = None) -> list:
        L.seed_everything(0, verbose=False)
        model = job.Recorder(kind)
        callbacks = [ModelCheckpoint(dirpath=tmp_path / kind, every_n_train_steps=2, save_top_k=-1)]
        run = trainer(enable_checkpointing=True, callbacks=callbacks)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run.fit(model, ckpt_path=ckpt)
        fit.warnings = [str(w.message) for w in caught]  # type: ignore[attr-defined]
        return model.seen

    for kind in KINDS:
        full = fit(kind)
        assert len(full) == 2 * steps_per_epoch
        checkpoint = next((tmp_path / kind).glob("epoch=0-step=2*.ckpt"))
        resumed = fit(kind, str(checkpoint))
        if kind == "stoker":
            assert resumed == full[2:], (
                "the resumed run did not continue where the checkpoint stopped"
            )
        else:
            assert steps(resumed) != steps(full[2:])
            assert any("not resumable" in w for w in fit.warnings)  # type: ignore[attr-defined]
