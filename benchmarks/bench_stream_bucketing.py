"""Padding saved by stoker.BucketStream against plain batching, on lognormal token lengths.

A stream of token sequences whose lengths follow a lognormal distribution (median
``exp(mu)`` tokens, clipped to ``[min_len, max_len]``, as tokenised web text roughly is) is
batched three ways, in stream order:

- plain: consecutive ``batch_size`` samples, each batch padded to its longest sample;
- sorted windows: ``BucketStream(stream, batch_size, window=W)``;
- boundaries: ``BucketStream(stream, batch_size, window=W, boundaries=[...])`` with
  power-of-two bucket limits.

For each it counts the padding tokens (``sum(max length * batch size - sum of lengths)``)
and the share of all tokens in the padded batches that are padding, and prints the ratio
of padding tokens against plain batching. It also times one pass of each (bucketing's
own cost per sample). Pure Python, no loader, no workers: the figure is a property of the
batches, not of the machine. It asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_stream_bucketing.py`` (a few seconds).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stoker import BucketStream, IterableDataset


class TokenLengths(IterableDataset):
    """A stream of token-id lists with lognormal lengths (one sample: a list of ints)."""

    def __init__(self, n: int, mu: float, sigma: float, min_len: int, max_len: int, seed: int):
        rng = np.random.default_rng(seed)
        self.lengths = np.clip(rng.lognormal(mu, sigma, n), min_len, max_len).astype(np.int64)

    def __iter__(self):
        for n in self.lengths.tolist():
            yield range(n)  # len() is all bucketing and padding look at


def plain_batches(stream, batch_size):
    batch = []
    for sample in stream:
        batch.append(sample)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def padding(batches) -> tuple[int, int, int, float]:
    """(padding tokens, real tokens, batches, seconds) of one pass."""
    pad = real = count = 0
    start = time.perf_counter()
    for batch in batches:
        lengths = [len(s) for s in batch]
        pad += max(lengths) * len(lengths) - sum(lengths)
        real += sum(lengths)
        count += 1
    return pad, real, count, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window", type=int, default=32 * 32, help="samples per window")
    parser.add_argument("--mu", type=float, default=5.5, help="log of the median length")
    parser.add_argument("--sigma", type=float, default=0.9)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stream = TokenLengths(args.samples, args.mu, args.sigma, args.min_len, args.max_len, args.seed)
    lengths = stream.lengths
    print(
        f"{args.samples:,} samples, lognormal(mu={args.mu}, sigma={args.sigma}) lengths clipped "
        f"to [{args.min_len}, {args.max_len}]: median {int(np.median(lengths))}, mean "
        f"{lengths.mean():.0f}, p99 {int(np.percentile(lengths, 99))}; "
        f"batch_size={args.batch_size}, window={args.window}"
    )
    bounds = [2**k for k in range(4, 13)]
    ways = {
        "plain batching": lambda: plain_batches(stream, args.batch_size),
        "BucketStream, sorted windows": lambda: BucketStream(
            stream, args.batch_size, window=args.window, seed=args.seed
        ),
        "BucketStream, boundaries 16..4096": lambda: BucketStream(
            stream, args.batch_size, window=args.window, boundaries=bounds
        ),
    }
    base = None
    print(f"{'':36} {'padding tokens':>15} {'padding share':>14} {'vs plain':>9} {'us/sample':>10}")
    for name, make in ways.items():
        pad, real, _, seconds = padding(make())
        base = pad if base is None else base
        share = pad / (pad + real)
        print(
            f"{name:36} {pad:>15,} {share:>13.1%} {pad / base:>9.3f} "
            f"{seconds / args.samples * 1e6:>10.2f}"
        )


if __name__ == "__main__":
    main()
