"""One PyTorch Lightning training job on two CPU processes, run by ``test_lightning.py``.

Usage: ``python lightning_job.py OUT_DIR stoker|torch ddp|ddp_spawn hook|argument``.
Lightning starts the second process itself (``ddp`` runs this script again, ``ddp_spawn``
spawns it) and injects a ``DistributedSampler`` into the loader, which the module's
``train_dataloader`` hook builds (``hook``) or ``fit`` receives (``argument``). Each rank
writes ``OUT_DIR/rank-<r>.json``: the type of the loader it trained from and of its
sampler, and per step the epoch, the batch's indices and its augmentation draws.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
import torch.utils.data as tud

import stoker.torch

N = 24
BATCH = 4
EPOCHS = 2


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


def main(out_dir: str, kind: str, strategy: str, source: str) -> None:
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


if __name__ == "__main__":
    main(*sys.argv[1:5])
