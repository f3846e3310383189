"""loader.stats(): per-stage timings, throughput, utilisation, the slowest work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from stoker import DataLoader
from stoker.profiling.stats import StatsRecorder


class Slow:
    """Index 5 is slow to fetch; every fetch sleeps a little so stages are measurable."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.02 if i == 5 else 0.001)
        return np.full(4, i, dtype=np.float32)


def slow_collate(samples):
    time.sleep(0.003)
    return np.stack(samples)


@pytest.mark.parametrize(
    "config",
    [{}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}],
    ids=["main", "processes", "threads"],
)
def test_stats_account_for_every_stage(config) -> None:
    loader = DataLoader(Slow(), batch_size=4, collate_fn=slow_collate, **config)
    assert loader.stats().batches == 0
    batches = list(loader)
    stats = loader.stats()
    assert stats.batches == len(batches) == 6
    assert stats.samples == 24
    assert stats.fetch_s >= 24 * 0.001 + 0.019  # every sleep in __getitem__ is counted
    assert stats.collate_s >= 6 * 0.003
    assert stats.wall_s > 0 and stats.batches_per_s == pytest.approx(6 / stats.wall_s)
    assert stats.sampling_s >= 0
    # the slowest batch is the one holding index 5
    seconds, indices = stats.slowest_batches[0]
    assert 5 in list(indices) and seconds >= 0.02
    text = str(stats)
    assert text.startswith("6 batches, 24 samples in ")
    assert "per batch: sampling " in text and "fetch " in text and "wait " in text
    if config.get("num_workers"):
        assert set(stats.worker_busy_s) <= {0, 1} and stats.worker_busy_s
        assert 0 < stats.worker_utilisation <= 1
        assert "2 workers" in text
    else:
        assert stats.wait_s >= stats.fetch_s  # without workers the consumer waits for all of it
        assert stats.worker_busy_s == {}  # the trainer loaded every batch: no worker's share
    loader.close()


def test_stats_keep_counting_across_epochs() -> None:
    loader = DataLoader(Slow(8), batch_size=4)
    list(loader)
    list(loader)
    assert loader.stats().batches == 4
    assert loader.stats().samples == 16


def test_per_sample_timing_is_off_unless_asked() -> None:
    loader = DataLoader(Slow(8), batch_size=4)
    list(loader)
    assert loader.stats().slowest_samples == []


def test_per_sample_timing_and_logging_with_the_environment_variable(tmp_path) -> None:
    script = textwrap.dedent(
        """
        import logging, sys, time
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        from test_loader_stats import Slow
        from stoker import DataLoader
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s", stream=sys.stdout)
        for workers in (0, 2):
            loader = DataLoader(Slow(12), batch_size=4, num_workers=workers)
            list(loader)
            seconds, index = loader.stats().slowest_samples[0]
            print("SLOWEST", workers, index, seconds >= 0.02)
            loader.close()
        """
    )
    env = {**os.environ, "STOKER_PROFILE_SAMPLES": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script, os.path.dirname(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "SLOWEST 0 5 True" in out
    assert "SLOWEST 2 5 True" in out
    assert "stoker.samples sample 5 loaded in " in out


def test_ray_actor_figures_keep_their_worker_and_a_nodes_sum_has_none() -> None:
    recorder = StatsRecorder(num_workers=3)
    for actor, worker_id, node in (("a0", 0, "node A"), ("a1", 1, "node A"), ("a2", 2, "node B")):
        recorder.actor_loaded(actor, worker_id, node, 4, 1000, 0.01, 0.002)
    figures = recorder.snapshot()
    assert [a.worker_id for a in figures.actors.values()] == [0, 1, 2]
    nodes = figures.nodes
    assert {name: (n.worker_id, n.actors, n.samples) for name, n in nodes.items()} == {
        "node A": (None, 2, 8),
        "node B": (None, 1, 4),
    }
    assert "actor a1 (worker 1)" in str(figures)
