"""Two real ranks under torchrun (gloo, CPU): DistributedSampler, stoker.torch and sharding.

The job itself is ``torchrun_job.py``; rank 0 writes what every rank loaded to a JSON
file, and the assertions run here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the job runs under torch.distributed's torchrun")

import stoker
from frameworks.framework_harness import run_job

N = 23  # torchrun_job.N
JOB = Path(__file__).with_name("torchrun_job.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("torchrun")
    files, lines = [], []
    for k, n in enumerate([6, 1, 9]):
        path = tmp / f"shard-{k}.txt"
        path.write_text("".join(f"{k}:{i}\n" for i in range(n)), encoding="utf-8")
        files.append(str(path))
        lines.extend(f"{k}:{i}" for i in range(n))
    out = tmp / "result.json"
    env = dict(os.environ)
    src = str(Path(stoker.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
        str(JOB), str(out), *files,
    ]  # fmt: skip
    run_job(command, env)
    result = json.loads(out.read_text(encoding="utf-8"))
    result["all_lines"] = lines
    return result


def runs(job: dict, key: str) -> list[list[dict]]:
    """runs[rank][epoch]"""
    return [rank[key] for rank in job["ranks"]]


def test_ranks_find_their_rank_and_world_size_from_torch_distributed(job) -> None:
    assert job["world_size"] == 2
    for key in ("drop-0", "pad-0", "drop-2", "pad-2"):
        for rank, epochs in enumerate(runs(job, key)):
            assert all(e["rank"] == rank and e["replicas"] == 2 for e in epochs), key


@pytest.mark.parametrize("workers", [0, 2])
def test_drop_mode_ranks_are_disjoint_and_equal_sized(job, workers) -> None:
    per_rank = runs(job, f"drop-{workers}")
    for epoch in range(2):
        a, b = (per_rank[r][epoch]["indices"] for r in range(2))
        assert len(a) == len(b) == N // 2
        assert not set(a) & set(b)
        assert len(set(a) | set(b)) == N - 1  # one sample dropped, none read twice


@pytest.mark.parametrize("workers", [0, 2])
def test_pad_mode_ranks_cover_the_dataset(job, workers) -> None:
    per_rank = runs(job, f"pad-{workers}")
    for epoch in range(2):
        a, b = (per_rank[r][epoch]["indices"] for r in range(2))
        assert len(a) == len(b) == -(-N // 2)
        assert set(a) | set(b) == set(range(N))


def test_the_order_changes_with_the_epoch_and_not_with_the_workers(job) -> None:
    for mode in ("drop", "pad"):
        for rank in range(2):
            without, with_workers = runs(job, f"{mode}-0")[rank], runs(job, f"{mode}-2")[rank]
            assert without[0]["indices"] != without[1]["indices"]
            assert [e["indices"] for e in without] == [e["indices"] for e in with_workers]


def test_each_ranks_sampler_state_resumes_the_same_order(job) -> None:
    for key in ("drop-0", "pad-0", "drop-2", "pad-2"):
        for epochs in runs(job, key):
            for e in epochs:
                assert e["resumed"] == e["indices"], key


def test_sharded_text_files_are_read_once_over_ranks_and_workers(job) -> None:
    lines = [line for rank in job["ranks"] for line in rank["lines"]]
    assert all(rank["lines"] for rank in job["ranks"]), "every rank read something"
    assert sorted(lines) == sorted(job["all_lines"])
