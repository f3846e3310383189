"""stoker.profile: the data-wait share of each step and its verdicts."""

from __future__ import annotations

import time

import numpy as np

import stoker
from stoker import DataLoader, profile


class Costly:
    def __init__(self, fetch_s: float, n: int = 40) -> None:
        self.fetch_s = fetch_s
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.fetch_s)
        return np.zeros(2)


def run(loader, step_s: float) -> stoker.profiling.Profile:
    with profile(loader) as p:
        for _batch in p:
            time.sleep(step_s)  # the training step
    return p


def test_a_slow_pipeline_is_called_the_bottleneck_with_advice() -> None:
    p = run(DataLoader(Costly(0.004), batch_size=2), step_s=0.001)
    assert p.steps == 20
    assert p.data_wait_share > 0.5
    assert p.verdict.startswith(
        "data-bound: the pipeline is the bottleneck. It loads in the main process"
    )
    report = p.report()
    assert report.startswith("profiled 18 steps (first 1 excluded): step ")
    assert "verdict: data-bound" in report


def test_with_workers_the_advice_names_the_dominant_stage() -> None:
    loader = DataLoader(Costly(0.004), batch_size=4, num_workers=2, prefetch_factor=1)
    p = run(loader, step_s=0.0005)
    assert p.data_wait_share > 0.2
    assert "Fetching dominates" in p.verdict
    assert "stoker pack" in p.verdict


def test_a_fast_pipeline_is_compute_bound() -> None:
    # 20 steps of 20 ms, each batch ~0.1 ms of work: a worker delayed now and then by other
    # jobs on the machine still leaves the wait far under 5% of the steps
    loader = DataLoader(Costly(0.0, n=60), batch_size=3, num_workers=2, persistent_workers=True)
    p = run(loader, step_s=0.02)
    assert p.data_wait_share < 0.05
    assert p.verdict.startswith("compute-bound")
    loader.close()


def test_profile_works_as_a_plain_iterator_and_over_any_iterable() -> None:
    p = profile([1, 2, 3, 4])
    assert list(p) == [1, 2, 3, 4]
    assert p.steps == 4
    assert "verdict:" in p.report()
    single = profile([1])
    list(single)
    assert single.report() == "profiled 1 step(s): too few to judge (need at least 3)"
