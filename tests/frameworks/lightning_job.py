"""One PyTorch Lightning training job on two CPU processes, run by ``test_lightning.py``.

Usage: ``python lightning_job.py OUT_DIR stoker|torch ddp|ddp_spawn hook|argument [resume]``.
Lightning starts the second process itself (``ddp`` runs this script again, ``ddp_spawn``
spawns it) and injects a ``DistributedSampler`` into the loader, which the module's
``train_dataloader`` hook builds (``hook``) or ``fit`` receives (``argument``). Each rank
writes ``OUT_DIR/rank-<r>.json``: the type of the loader it trained from and of its
sampler, and per step the epoch, the batch's indices and its augmentation draws.

With ``resume`` (``ddp``, ``hook``) the job trains twice: once uninterrupted, saving a
checkpoint every ``RESUME_EVERY`` steps, then from the mid-epoch checkpoint ``RESUME_AT``
in a new trainer; each rank's JSON holds the steps of both runs (``full``, ``resumed``)
and the warnings each run gave.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.utils.data as tud
from lightning.pytorch.callbacks import ModelCheckpoint

import stoker.torch

N = 24
BATCH = 4
EPOCHS = 2
STEPS_PER_EPOCH = N // 2 // BATCH  # per rank, on two ranks
RESUME_EVERY = 2  # steps between the checkpoints of the resume job
RESUME_AT = "epoch=1-step=4.ckpt"  # epoch 0 and 1 of epoch 1's 3 steps done


class Indexed(tud.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "x": torch.tensor([float(i)]), "noise": torch.rand(())}


def make_loader(kind: str, **options) -> tud.DataLoader:
    cls = stoker.torch.DataLoader if kind == "stoker" else tud.DataLoader
    return cls(Indexed(), batch_size=BATCH, shuffle=True, num_workers=2, **options)


class Recorder(L.LightningModule):
    """Records every training batch; builds its loader in the hook when asked to."""

    def __init__(self, kind: str, out_dir: str | None = None, from_hook: bool = True) -> None:
        super().__init__()
        self.kind, self.out_dir, self.from_hook = kind, out_dir, from_hook
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list] = []

    def train_dataloader(self) -> tud.DataLoader:
        if not self.from_hook:
            raise AssertionError("the loader was passed to fit()")
        return make_loader(self.kind)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        noise = [round(float(v), 6) for v in batch["noise"]]
        self.seen.append([self.current_epoch, batch["index"].tolist(), noise])
        return self.layer(batch["x"]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        if self.out_dir is None:
            return
        loader = self.trainer.train_dataloader
        record = {
            "rank": self.global_rank,
            "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
            "sampler": type(loader.sampler).__qualname__,
            "seen": self.seen,
        }
        Path(self.out_dir, f"rank-{self.global_rank}.json").write_text(
            json.dumps(record), encoding="utf-8"
        )


def main(out_dir: str, kind: str, strategy: str, source: str, mode: str = "fit") -> None:
    if mode == "resume":
        resume(out_dir, kind, strategy)
        return
    L.seed_everything(0, verbose=False)
    model = Recorder(kind, out_dir, from_hook=source == "hook")
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=EPOCHS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    if source == "hook":
        trainer.fit(model)
    else:
        trainer.fit(model, train_dataloaders=make_loader(kind))


def resume(out_dir: str, kind: str, strategy: str) -> None:
    """Trains uninterrupted with a checkpoint every RESUME_EVERY steps, then trains again from
    the mid-epoch checkpoint RESUME_AT in a new trainer; writes both runs' steps per rank."""
    runs = {}
    for phase in ("full", "resumed"):
        L.seed_everything(0, verbose=False)
        model = Recorder(kind)
        checkpoints = ModelCheckpoint(
            dirpath=Path(out_dir, "checkpoints"), every_n_train_steps=RESUME_EVERY, save_top_k=-1
        )
        first = phase == "full"
        trainer = L.Trainer(
            accelerator="cpu", devices=2, strategy=strategy, max_epochs=EPOCHS, logger=False,
            enable_checkpointing=first, callbacks=[checkpoints] if first else [],
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        ckpt = None if first else str(Path(out_dir, "checkpoints", RESUME_AT))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model, ckpt_path=ckpt)
        runs[phase] = model.seen
        runs[f"{phase}_warnings"] = [str(w.message) for w in caught]
    loader = trainer.train_dataloader
    runs["rank"] = trainer.global_rank
    runs["loader"] = f"{type(loader).__module__}.{type(loader).__qualname__}"
    runs["sampler"] = type(loader.sampler).__qualname__
    Path(out_dir, f"rank-{trainer.global_rank}.json").write_text(json.dumps(runs), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:6])
