"""Launched by test_torchrun.py with ``torchrun --nproc_per_node=2``: one rank of a job.

Each rank builds stoker's DistributedSampler *without* num_replicas / rank (they come
from torch.distributed), loads two epochs with stoker.torch.DataLoader (no workers, then
two process workers), checks its sampler's state round trip, reads a sharded text
dataset, and gathers everything on rank 0, which writes it as JSON to ``argv[1]``.
``argv[2:]`` are the text files.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import stoker
from stoker.sharding import ShardedIterable
from stoker.torch import DataLoader

N = 23


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def read_lines(path: str):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def one_run(mode: str, num_workers: int) -> list[dict]:
    sampler = stoker.DistributedSampler(Indices(), shuffle=True, seed=7, mode=mode)
    loader = DataLoader(Indices(), batch_size=4, sampler=sampler, num_workers=num_workers)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        state = sampler.state_dict()
        indices = [int(i) for batch in loader for i in batch]
        resumed = stoker.DistributedSampler(Indices(), shuffle=True, seed=12345, mode=mode)
        resumed.load_state_dict(state)
        epochs.append(
            {
                "rank": sampler.rank,
                "replicas": sampler.num_replicas,
                "indices": indices,
                "resumed": list(resumed),
            }
        )
    loader.close()
    return epochs


def main() -> None:
    out_path, files = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {f"{mode}-{w}": one_run(mode, w) for mode in ("drop", "pad") for w in (0, 2)}
    mine["lines"] = list(
        DataLoader(ShardedIterable(files, read_lines), batch_size=None, num_workers=2)
    )
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"world_size": world, "ranks": gathered}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
