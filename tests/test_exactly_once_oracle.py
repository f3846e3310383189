"""The exactly-once oracle, drawn by hypothesis: over every rank and worker of a drawn
configuration, each sample of an epoch is delivered exactly once or named in the error
report, with bad samples skipped and workers killed and replaced along the way."""

from __future__ import annotations

import collections
import json
import os
import signal
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.oracle import ORACLE_SETTINGS
from stoker import DataLoader, DistributedSampler
from stoker.formats import JsonLines
from stoker.samplers import ShardSampler


class Flaky:
    """``n`` samples; those in ``bad`` raise; the first load of ``kill`` kills its worker.

    The kill happens once per marker file (the replacement worker loads the sample), and only
    in a worker process: a thread worker or the main process cannot be killed this way.
    """

    def __init__(self, n: int, bad: frozenset[int], kill: int | None, marker: str) -> None:
        self.n, self.bad, self.kill, self.marker = n, bad, kill, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        i = int(i)
        if i == self.kill and os.getpid() != int(Path(self.marker).read_text() or 0):
            try:
                fd = os.open(self.marker + ".killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        if i in self.bad:
            raise ValueError(f"sample {i} is damaged")
        return i


def _delivered(loader: DataLoader) -> list[int]:
    return [int(i) for batch in loader for i in np.atleast_1d(np.asarray(batch))]


@st.composite
def map_configs(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 40))
    workers = draw(st.integers(0, 3))
    mode = draw(st.sampled_from(["process", "thread"])) if workers else "process"
    return {
        "n": n,
        "ranks": draw(st.integers(1, 3)),
        "sampler": draw(st.sampled_from(["default", "shuffle", "distributed", "shards"])),
        "batch_size": draw(st.sampled_from([None, 1, 3, 4])),
        "bad": frozenset(draw(st.sets(st.integers(0, n - 1), max_size=3))),
        "kill": draw(st.one_of(st.none(), st.integers(0, n - 1))) if mode == "process" else None,
        "workers": workers,
        "mode": mode,
        "in_order": draw(st.booleans()),
        "persistent": draw(st.booleans()),
        "epochs": draw(st.integers(1, 2)),
    }


def _map_loader(config: dict, rank: int, dataset: Flaky) -> DataLoader:
    n, ranks = config["n"], config["ranks"]
    sampler = None
    if config["sampler"] == "distributed":
        # a whole number of samples per rank: DistributedSampler pads otherwise, by design
        sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, seed=2)
    elif config["sampler"] == "shards" or ranks > 1:
        sizes = [3] * (n // 3) + ([n % 3] if n % 3 else [])
        sampler = ShardSampler(dataset, shard_sizes=sizes, num_replicas=ranks, rank=rank, seed=2)
    workers = config["workers"]
    options = (
        {
            "num_workers": workers,
            "worker_mode": config["mode"],
            "in_order": config["in_order"],
            "persistent_workers": config["persistent"],
            "on_worker_death": "restart",
        }
        if workers
        else {}
    )
    return DataLoader(
        dataset,
        batch_size=config["batch_size"],
        shuffle=True if config["sampler"] == "shuffle" and sampler is None else None,
        sampler=sampler,
        generator=5,
        on_error="skip",
        max_errors=None,
        **options,
    )


@ORACLE_SETTINGS
@given(config=map_configs())
def test_every_sample_arrives_once_per_epoch_or_is_named(config: dict) -> None:
    run_map_oracle(config)


def run_map_oracle(config: dict) -> bool:
    """Runs the configuration on every rank; returns whether a worker was killed."""
    n = config["n"]
    if config["sampler"] == "distributed":
        config = {**config, "n": n - n % config["ranks"] or config["ranks"]}
        n = config["n"]
        config["bad"] = frozenset(i for i in config["bad"] if i < n)
        if config["kill"] is not None and config["kill"] >= n:
            config["kill"] = None
    with tempfile.TemporaryDirectory() as folder:
        marker = os.path.join(folder, "trainer")
        Path(marker).write_text(str(os.getpid()))  # the trainer is never killed
        loaders = [
            _map_loader(config, rank, Flaky(n, config["bad"], config["kill"], marker))
            for rank in range(config["ranks"])
        ]
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _check_epochs(config, loaders)
            killed = os.path.exists(marker + ".killed")
            replaced = [w for w in caught if "started a replacement" in str(w.message)]
            assert len(replaced) == killed, [str(w.message) for w in caught]
            if killed:
                assert "was killed by SIGKILL" in str(replaced[0].message)
            return killed
        finally:
            for loader in loaders:
                loader.close()


def _check_epochs(config: dict, loaders: list[DataLoader]) -> None:
    n = config["n"]
    for epoch in range(config["epochs"]):
        counts = collections.Counter()
        named: list[int] = []
        for loader in loaders:
            before = len(loader.error_report())
            counts.update(_delivered(loader))
            named.extend(s.index for s in list(loader.error_report())[before:])
        assert sorted(named) == sorted(config["bad"]), (epoch, named, config)
        assert set(counts) | set(named) == set(range(n)), (epoch, counts, config)
        assert all(c == 1 for c in counts.values()), (epoch, counts, config)
        assert not set(counts) & set(named), (epoch, counts, named, config)


@st.composite
def stream_configs(draw: st.DrawFn) -> dict:
    return {
        "files": draw(st.lists(st.integers(0, 9), min_size=1, max_size=4)),
        "ranks": draw(st.integers(1, 3)),
        "workers": draw(st.integers(0, 3)),
        "batch_size": draw(st.sampled_from([None, 1, 4])),
        "shuffle_buffer": draw(st.sampled_from([None, 3])),
        "persistent": draw(st.booleans()),
    }


@ORACLE_SETTINGS
@given(config=stream_configs())
def test_every_record_of_a_stream_arrives_once_over_ranks_and_workers(config: dict) -> None:
    """Files are split by rank, then by worker: every record once, over all of them."""
    with tempfile.TemporaryDirectory() as folder:
        paths, record = [], 0
        for k, count in enumerate(config["files"]):
            path = Path(folder, f"part-{k}.jsonl")
            path.write_text("".join(json.dumps({"id": record + j}) + "\n" for j in range(count)))
            record += count
            paths.append(str(path))
        counts = collections.Counter()
        for rank in range(config["ranks"]):
            reader = JsonLines(
                paths,
                rank=rank,
                world_size=config["ranks"],
                shuffle_buffer=config["shuffle_buffer"],
                transform=lambda row: row["id"],
            )
            workers = config["workers"]
            loader = DataLoader(
                reader,
                batch_size=config["batch_size"],
                num_workers=workers,
                persistent_workers=config["persistent"] and workers > 0,
            )
            with loader:
                counts.update(_delivered(loader))
        assert sorted(counts.elements()) == list(range(record)), (counts, config)


@pytest.mark.parametrize("kill", [0, 7])
def test_a_killed_and_replaced_worker_loses_and_repeats_nothing(kill: int) -> None:
    """One example of the oracle above, run every time: a worker dies loading a sample."""
    config = {
        "n": 12, "ranks": 1, "sampler": "shuffle", "batch_size": 3, "bad": frozenset({4}),
        "kill": kill, "workers": 2, "mode": "process", "in_order": True, "persistent": False,
        "epochs": 1,
    }  # fmt: skip
    assert run_map_oracle(config), "the worker loading the sample was not killed"
