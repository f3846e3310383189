"""What a resumable shuffle buffer over a stream of large samples costs a loader with workers.

A stream of ``--samples`` samples of ``--sample-kb`` KB each (numpy uint8 arrays) that has its
own ``state_dict`` is read through ``ShuffleBuffer(stream, --buffer)`` by
``DataLoader(batch_size=--batch, num_workers=N)``, for N = 0 and 2. Each configuration runs
one epoch in a fresh process, takes one ``state_dict()`` half-way, and reports:

- samples/s over the epoch (the consumer does nothing with the batches);
- the trainer's peak RSS and the largest peak RSS of its workers (``ru_maxrss``);
- the time ``state_dict()`` took and the size of the pickled state.

Such a buffer over a stream that is not one of stoker's readers stores its samples in its
state, so that state is large; what matters is how often it is made, sent and kept. It
asserts nothing. Run: ``.venv/bin/python benchmarks/bench_stream_state.py`` (about a minute;
``--samples 4000`` for steadier figures).
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import time

import numpy as np

from stoker import DataLoader, IterableDataset, ShuffleBuffer, get_worker_info


class Blobs(IterableDataset):
    """``n`` arrays of ``nbytes`` bytes, split between workers, with a resumable place."""

    def __init__(self, n: int, nbytes: int) -> None:
        self.n, self.nbytes, self.at = n, nbytes, 0

    def __iter__(self):
        info = get_worker_info()
        mine = range(self.n) if info is None else range(info.id, self.n, info.num_workers)
        while self.at < len(mine):
            value = mine[self.at]
            self.at += 1
            yield np.full(self.nbytes, value % 251, dtype=np.uint8)
        self.at = 0

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


def one(args: argparse.Namespace) -> dict[str, float]:
    stream = ShuffleBuffer(Blobs(args.samples, args.sample_kb * 1024), args.buffer)
    loader = DataLoader(
        stream, batch_size=args.batch, collate_fn=list, num_workers=args.workers, generator=0
    )
    batches = args.samples // args.batch
    began = time.perf_counter()
    state_s, state_bytes = 0.0, 0
    for i, _batch in enumerate(loader):
        if i == batches // 2:
            asked = time.perf_counter()
            state = loader.state_dict()
            state_s = time.perf_counter() - asked
            state_bytes = len(pickle.dumps(state))
            del state
        del _batch
    wall = time.perf_counter() - began - state_s
    loader.close()
    return {
        "samples_per_s": args.samples / wall,
        "trainer_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "state_ms": 1000 * state_s,
        "state_mib": state_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--sample-kb", type=int, default=100)
    parser.add_argument("--buffer", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workers is not None:
        print(json.dumps(one(args)))
        return
    stream_mib = args.samples * args.sample_kb / 1024
    print(
        f"{args.samples} samples of {args.sample_kb} KB ({stream_mib:.0f} MiB), "
        f"ShuffleBuffer({args.buffer}), batch_size={args.batch}"
    )
    print(f"{'workers':>7} {'samples/s':>10} {'trainer MiB':>12} {'worker MiB':>11} "
          f"{'state_dict ms':>14} {'state MiB':>10}")  # fmt: skip
    for workers in (0, 2):
        command = [sys.executable, __file__, *sys.argv[1:], "--workers", str(workers)]
        out = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
        print(
            f"{workers:>7} {out['samples_per_s']:>10,.0f} {out['trainer_mib']:>12,.0f} "
            f"{out['worker_mib']:>11,.0f} {out['state_ms']:>14,.1f} {out['state_mib']:>10,.1f}"
        )


if __name__ == "__main__":
    main()
