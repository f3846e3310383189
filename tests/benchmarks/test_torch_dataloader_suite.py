"""``benchmarks/torch_dataloader_suite.py`` on a small stand-in for PyTorch's test file.

The stand-in's tests build ``torch.utils.data.DataLoader`` in the test process and in a
spawned worker process, and write down which class they got; the runner must give them
torch's in the reference run and stoker's in the other, then print its table and the
test that passes with torch only, and write the same in its JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "torch_dataloader_suite.py"

# Each test appends what it saw to $SUITE_PROBE_OUT, one JSON line per process.
STAND_IN = '''\
import json
import os

import torch.utils.data as tud


def record(where, cls):
    line = {"run": os.environ["STOKER_SUITE_LOADER"], "where": where, "pid": os.getpid(),
            "class": f"{cls.__module__}.{cls.__qualname__}"}
    with open(os.environ["SUITE_PROBE_OUT"], "a") as f:
        f.write(json.dumps(line) + "\\n")


class Probe(tud.Dataset):
    """Writes down, from the process that loads it, the class torch.utils.data.DataLoader is."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        record("worker", tud.DataLoader)
        return i


def test_in_the_test_process():
    loader = tud.DataLoader(list(range(5)), batch_size=2)
    record("test", type(loader))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


def test_in_a_spawned_worker():
    loader = tud.DataLoader(Probe(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    record("test", type(loader))
    assert [b.tolist() for b in loader] == [[0, 1]]


def test_only_torch_passes():
    assert type(tud.DataLoader([0])).__module__ == "torch.utils.data.dataloader", "not torch's"
'''


def test_the_suite_substitutes_stokers_loader_in_every_process_and_reports(tmp_path) -> None:
    pytest.importorskip("torch", reason="the suite runs PyTorch's DataLoader tests")
    for name in ("pytest_timeout", "expecttest", "psutil"):
        pytest.importorskip(name, reason="the suite needs it (see its docstring)")
    test_file = tmp_path / "test_dataloader.py"
    test_file.write_text(STAND_IN, encoding="utf-8")
    probe, out_json = tmp_path / "probe.jsonl", tmp_path / "suite.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "SUITE_PROBE_OUT": str(probe),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, str(SCRIPT), "--test-file", str(test_file), "--timeout", "60"]
    done = subprocess.run(
        [*command, "--json", str(out_json)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    seen = [json.loads(line) for line in probe.read_text(encoding="utf-8").splitlines()]
    classes = {"torch": "torch.utils.data.dataloader.DataLoader",
               "stoker": "stoker.torch._loader.DataLoader"}  # fmt: skip
    for run, cls in classes.items():
        mine = [s for s in seen if s["run"] == run]
        assert [s["where"] for s in mine] == ["test", "test", "worker", "worker"], run
        assert {s["class"] for s in mine} == {cls}, f"the {run} run built another loader: {mine}"
        tests, workers = {s["pid"] for s in mine[:2]}, {s["pid"] for s in mine[2:]}
        assert len(tests) == len(workers) == 1 and not tests & workers, "no worker process"

    out = done.stdout
    assert "3 tests in " in out
    table = {
        row[0]: row[1:]
        for row in (line.split() for line in out.splitlines())
        if row and row[0] in classes
    }  # loader, passed, failed, error, skipped, xfailed, total, time
    assert table["torch"][:6] == ["3", "0", "0", "0", "0", "3"]
    assert table["stoker"][:6] == ["2", "1", "0", "0", "0", "3"]
    assert re.search(
        r"Pass with torch, fail with stoker \(1\):\n  test_only_torch_passes  \[failed\]", out
    )
    assert "not torch's" in out

    saved = json.loads(out_json.read_text(encoding="utf-8"))
    nodeid = "test_dataloader.py::test_only_torch_passes"
    assert saved["pass_with_torch_fail_with_stoker"] == [nodeid]
    assert saved["runs"]["torch"]["counts"]["passed"] == 3
    assert saved["runs"]["stoker"]["counts"] == {
        "passed": 2, "failed": 1, "error": 0, "skipped": 0, "xfailed": 0, "xpassed": 0,
    }  # fmt: skip
    assert saved["runs"]["stoker"]["tests"][nodeid]["outcome"] == "failed"
