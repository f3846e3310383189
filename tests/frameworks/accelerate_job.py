"""One Hugging Face accelerate training job, run by ``test_accelerate.py`` under torchrun.

Usage: ``torchrun --nproc_per_node=N accelerate_job.py OUT_DIR stoker|torch``. Each rank
writes ``OUT_DIR/rank-<r>.json`` with what it trained on: per epoch the batches' sample
indices and augmentation draws, ``sync_gradients`` after every step, the indices
``gather_for_metrics`` returned, the type and dtype of each field, and the batches (and
their fields' types) a resumed run sees after ``skip_first_batches``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.utils import set_seed

import stoker.torch

N = 30  # samples; 2 ranks x batch 4 = 8 per step, so the last step is padded by accelerate
BATCH = 4
ACCUMULATE = 3
SKIP = 2


class Indexed(tud.Dataset):
    """Sample i: its index, a feature, a label, and one random draw (an augmentation)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "x": torch.tensor([float(i)]), "y": i % 3, "noise": torch.rand(())}


def build(kind: str) -> tuple:
    set_seed(0)
    model = torch.nn.Linear(1, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cls = stoker.torch.DataLoader if kind == "stoker" else tud.DataLoader
    loader = cls(Indexed(), batch_size=BATCH, shuffle=True, num_workers=2)
    return model, optimizer, loader


def types(batch: dict) -> set[str]:
    """``field:type:dtype`` of each field (an ndarray would also have ``.tolist()``)."""
    return {f"{k}:{type(v).__module__}.{type(v).__name__}:{v.dtype}" for k, v in batch.items()}


def main(out_dir: str, kind: str) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model, optimizer, loader = build(kind)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    record: dict = {
        "rank": accelerator.process_index,
        "base": type(prepared.base_dataloader).__name__,
        "engine": type(prepared.base_dataloader).__module__,
        "len": len(prepared),
        "epochs": [],
    }
    for _ in range(2):
        epoch: dict = {"batches": [], "noise": [], "sync": [], "gathered": [], "types": set()}
        for batch in prepared:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            epoch["sync"].append(accelerator.sync_gradients)
            epoch["batches"].append(batch["index"].tolist())
            epoch["noise"].append([round(float(v), 6) for v in batch["noise"]])
            epoch["gathered"].extend(accelerator.gather_for_metrics(batch["index"]).tolist())
            epoch["types"].update(types(batch))
        epoch["types"] = sorted(epoch["types"])
        record["epochs"].append(epoch)

    # A resumed run: the same set-up in a fresh state, then the first SKIP batches skipped.
    model, optimizer, loader = build(kind)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    resumed = accelerator.skip_first_batches(prepared, SKIP)
    record["resumed_len"] = len(resumed)
    record["resumed_engine"] = type(resumed.base_dataloader).__module__
    batches = list(resumed)
    record["resumed"] = [b["index"].tolist() for b in batches]
    record["resumed_noise"] = [[round(float(v), 6) for v in b["noise"]] for b in batches]
    record["resumed_types"] = sorted(set().union(*(types(b) for b in batches)))
    rank = accelerator.process_index
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
