"""``benchmarks/torchdata_suite.py`` on a small stand-in for torchdata's test files.

torchdata is not installed here: the test writes a stand-in ``torchdata.stateful_dataloader``
package whose ``StatefulDataLoader`` is torch's DataLoader (taking torchdata's
``snapshot_every_n_steps``), and a test file whose tests build it in the test process and in
a spawned worker process and write down which class they got. The runner must give them the
stand-in in the reference run and stoker's loader in the other, then print its table and the
test that passes with torchdata only, and write the same in its JSON. No network.
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
SCRIPT = ROOT / "benchmarks" / "torchdata_suite.py"

FAKE_TORCHDATA = {
    "torchdata/__init__.py": "",
    "torchdata/stateful_dataloader/__init__.py": (
        "from .stateful_dataloader import StatefulDataLoader\n"
    ),
    "torchdata/stateful_dataloader/stateful_dataloader.py": '''\
"""A stand-in for torchdata's module: torch's loader, with torchdata's extra keyword."""
from typing import TypeVar

from torch.utils.data import DataLoader

T = TypeVar("T")


class StatefulDataLoader(DataLoader[T]):
    def __init__(self, *args, snapshot_every_n_steps=1, **kwargs):
        super().__init__(*args, **kwargs)
''',
}

# Each test appends what it saw to $SUITE_PROBE_OUT, one JSON line per process.
STAND_IN = '''\
import json
import os
import unittest

import torchdata.stateful_dataloader
from torchdata.stateful_dataloader import StatefulDataLoader


def record(where, cls):
    line = {"run": os.environ["STOKER_SUITE_LOADER"], "where": where, "pid": os.getpid(),
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "stoker": any(c.__module__.startswith("stoker.") for c in cls.__mro__)}
    with open(os.environ["SUITE_PROBE_OUT"], "a") as f:
        f.write(json.dumps(line) + "\\n")


class Probe:
    """Writes down, from the process that loads it, the class StatefulDataLoader is there."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        record("worker", torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader)
        return i


def test_in_the_test_process():
    assert torchdata.stateful_dataloader.StatefulDataLoader is StatefulDataLoader
    assert StatefulDataLoader[int].__origin__ is StatefulDataLoader  # generic, as torchdata's
    loader = StatefulDataLoader(list(range(5)), batch_size=2, snapshot_every_n_steps=3)
    record("test", type(loader))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


def test_in_a_spawned_worker():
    loader = StatefulDataLoader(
        Probe(), batch_size=2, num_workers=1, multiprocessing_context="spawn"
    )
    record("test", type(loader))
    assert [b.tolist() for b in loader] == [[0, 1]]


def test_only_torchdata_passes():
    assert StatefulDataLoader.__module__.startswith("torchdata."), "not torchdata's"


class TestSubtests(unittest.TestCase):
    def test_one_subtest_passes_with_torchdata_only(self):
        for case in ("any loader", "torchdata's"):
            with self.subTest(case=case):
                is_torchdata = StatefulDataLoader.__module__.startswith("torchdata.")
                assert case == "any loader" or is_torchdata, "a subtest: not torchdata's"
'''


def test_the_suite_substitutes_stokers_loader_in_every_process_and_reports(tmp_path) -> None:
    pytest.importorskip("torch", reason="the suite runs torchdata's StatefulDataLoader tests")
    for name in ("pytest_timeout", "expecttest", "psutil"):
        pytest.importorskip(name, reason="the suite needs it (see its docstring)")
    for path, text in FAKE_TORCHDATA.items():
        (tmp_path / "fake" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fake" / path).write_text(text, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_stand_in.py").write_text(STAND_IN, encoding="utf-8")
    probe, out_json = tmp_path / "probe.jsonl", tmp_path / "suite.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path / "fake")]),
        "SUITE_PROBE_OUT": str(probe),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, str(SCRIPT), "--test-dir", str(tmp_path / "tests")]
    done = subprocess.run(
        [*command, "--files", "test_stand_in.py", "--timeout", "60", "--json", str(out_json)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    seen = [json.loads(line) for line in probe.read_text(encoding="utf-8").splitlines()]
    classes = {
        "torchdata": (
            "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader",
            False,
        ),
        "stoker": ("_torchdata_swap.StatefulDataLoader", True),
    }
    for run, cls in classes.items():
        mine = [s for s in seen if s["run"] == run]
        assert [s["where"] for s in mine] == ["test", "test", "worker", "worker"], run
        got = {(s["class"], s["stoker"]) for s in mine}
        assert got == {cls}, f"the {run} run built another loader: {mine}"
        tests, workers = {s["pid"] for s in mine[:2]}, {s["pid"] for s in mine[2:]}
        assert len(tests) == len(workers) == 1 and not tests & workers, "no worker process"

    out = done.stdout
    assert "4 tests in 1 file(s) of " in out
    table = out[out.index("\n  file ") :].split("\n\n", 1)[0]
    rows = [line.split() for line in table.strip().splitlines()]
    # file, loader, passed, failed, error, skipped, xfailed, total, time: the file's second row
    # leaves its name out
    assert rows[0] == [
        "file", "loader", "passed", "failed", "error", "skipped", "xfailed", "total", "time",
    ]  # fmt: skip
    assert rows[1][:8] == ["test_stand_in.py", "torchdata", "4", "0", "0", "0", "0", "4"], table
    assert rows[2][:7] == ["stoker", "2", "2", "0", "0", "0", "4"], table
    assert len(rows) == 3, table
    # a failed subTest fails its test, though pytest 9 reports the test itself as passed
    # (and names the subtest: "1 subtest(s) failed, the first (case=...): ...")
    assert "1 subtest(s) failed, the first (case=" in out or pytest.version_tuple < (9,)
    assert re.search(
        r"Pass with torchdata, fail with stoker \(2\):\n"
        r"  test_stand_in\.py::test_only_torchdata_passes  \[failed\]\n      .*not torchdata's\n"
        r"  test_stand_in\.py::TestSubtests::test_one_subtest_passes_with_torchdata_only  "
        r"\[failed\]\n      .*AssertionError: a subtest: not torchdata's\n",
        out,
    ), out

    saved = json.loads(out_json.read_text(encoding="utf-8"))
    nodeid = "test_stand_in.py::test_only_torchdata_passes"
    subtests = "test_stand_in.py::TestSubtests::test_one_subtest_passes_with_torchdata_only"
    assert saved["pass_with_torchdata_fail_with_stoker"] == [nodeid, subtests]
    runs = saved["files"]["test_stand_in.py"]["runs"]
    assert runs["torchdata"]["counts"]["passed"] == 4
    assert runs["stoker"]["counts"] == {
        "passed": 2, "failed": 2, "error": 0, "skipped": 0, "xfailed": 0, "xpassed": 0,
    }  # fmt: skip
    assert runs["stoker"]["tests"][nodeid]["outcome"] == "failed"
    assert "not torchdata's" in runs["stoker"]["tests"][nodeid]["message"]
