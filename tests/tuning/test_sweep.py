"""stoker.tuning: the sweep, its knee, its memory figures and the background load."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from stoker.tuning import (
    BackgroundLoad,
    SweepPoint,
    SweepResult,
    batch_nbytes,
    default_workers,
    memory_estimate,
    sweep,
)


def _point(workers: int, prefetch: int | None, seconds: float) -> SweepPoint:
    return SweepPoint(
        workers, prefetch, batches=10, samples=100, seconds=seconds, warmup_seconds=0.1,
        batch_bytes=1, memory_estimate_bytes=1, peak_rss_bytes=None, baseline_rss_bytes=None,
    )  # fmt: skip


def test_knee_is_the_fewest_workers_within_five_percent_of_the_best() -> None:
    result = SweepResult(
        (
            _point(0, None, 4.0),
            _point(1, 2, 2.0),
            _point(2, 2, 1.04),
            _point(2, 4, 1.02),
            _point(4, 2, 1.0),
        ),
        batch_size=10,
    )
    assert (result.best().num_workers, result.knee().num_workers) == (4, 2)
    assert result.knee().prefetch_factor == 2  # the smaller prefetch already qualifies
    assert result.knee_line() == (
        "knee: num_workers=2, prefetch_factor=2 reaches 96% of the best rate (100 samples/s with "
        "num_workers=4, prefetch_factor=2); more workers or prefetch add under 5% for their memory."
    )
    alone = SweepResult((_point(0, None, 2.0), _point(2, 2, 1.0)), batch_size=10)
    assert alone.knee_line().startswith(
        "knee: num_workers=2, prefetch_factor=2 is the fastest setting (100 samples/s)"
    )
    with pytest.raises(ValueError, match="the sweep measured no setting"):
        SweepResult((), batch_size=1).knee()


def test_default_workers_memory_estimate_and_batch_bytes() -> None:
    assert default_workers(1) == (0, 1)
    assert default_workers(2) == (0, 1, 2)
    assert default_workers(6) == (0, 1, 2, 4, 6)
    assert default_workers(8) == (0, 1, 2, 4, 8)
    assert memory_estimate(1000, 0, None) == 1000
    assert memory_estimate(1000, 4, 3) == 12_000
    batch = {
        "x": np.zeros((4, 5), np.float64),
        "meta": [b"abc", "de", 7],
        "pair": (np.zeros(3, np.int8), 1.5),
    }
    assert batch_nbytes(batch) == 160 + 3 + 2 + 8 + 3 + 8


def test_batch_bytes_of_torch_tensors() -> None:
    torch = pytest.importorskip("torch", reason="counts torch tensors, which need torch")
    assert batch_nbytes([torch.zeros(4, 3), torch.zeros(2, dtype=torch.int64)]) == 48 + 16


def test_sweep_checks_its_arguments() -> None:
    data = [np.zeros(2)] * 8
    with pytest.raises(
        ValueError, match=r"workers must be a non-empty list of integers >= 0, got \[-1\]"
    ):
        sweep(data, workers=[-1])
    with pytest.raises(
        ValueError, match=r"prefetch must be a non-empty list of integers >= 1, got \[\]"
    ):
        sweep(data, workers=[1], prefetch=[])
    with pytest.raises(ValueError, match="batches must be an integer >= 1, got 0"):
        sweep(data, workers=[0], batches=0)


def test_sweep_runs_across_epochs_when_the_dataset_is_short() -> None:
    result = sweep([np.zeros(2)] * 10, batch_size=4, workers=[0, 1], batches=7, warmup=2)
    # epochs of 4 + 4 + 2 samples: the warm-up takes 4 + 4, the timed batches 2, 4, 4, 2, 4, 4, 2
    assert [(p.batches, p.samples) for p in result.points] == [(7, 22), (7, 22)]


def test_background_load_counts_other_processes_not_ours() -> None:
    # a grandchild whose parent exits at once is re-parented: it is not one of ours
    spin = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    end = time.time() + 0.8\n"
        "    while time.time() < end: pass\n"
    )
    with BackgroundLoad() as load:
        subprocess.run([sys.executable, "-c", spin], check=True)
        time.sleep(0.8)
    assert load.cpus is not None and load.cpus >= 0.25  # the spinner kept about one CPU busy
