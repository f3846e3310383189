"""PyTorch's own DataLoader tests, run against torch's loader and against stoker's.

PyTorch's ``test/test_dataloader.py`` is run twice in one invocation: once as it is
(the reference) and once with ``torch.utils.data.DataLoader`` replaced by
``stoker.torch.DataLoader`` in the test process *and in every Python process it starts*
(spawned and forkserver workers, ``subprocess`` children). Then a table: passed / failed /
errors / skipped per loader, and each test that passes with torch and fails with stoker,
with the first line of its failure. ``docs/torch-compatibility.md`` explains every
remaining difference.

    .venv/bin/python benchmarks/torch_dataloader_suite.py --test-file /path/to/test_dataloader.py
    .venv/bin/python benchmarks/torch_dataloader_suite.py              # downloads it (see below)
    .venv/bin/python benchmarks/torch_dataloader_suite.py --loaders stoker -k worker_init \
        --json out.json

The test file is not part of this repository. Without ``--test-file`` the version for the
installed torch (tag ``v<torch version>``) is downloaded from raw.githubusercontent.com
once, into ``$STOKER_CACHE/torch-suite`` (default ``~/.cache/stoker/torch-suite``).

How the replacement reaches every process: a throwaway folder holds a ``sitecustomize.py``
and goes first on ``PYTHONPATH``; Python imports ``sitecustomize`` at start-up in every
process that inherits the environment. It waits for ``import torch`` to finish, then sets
``torch.utils.data.DataLoader`` and ``torch.utils.data.dataloader.DataLoader`` to
``stoker.torch.DataLoader``. The reference run uses the same folder with the
replacement switched off, so both runs see the same environment otherwise.

Each test has a time limit (``--timeout``, pytest-timeout); a test that crashes the test
process is recorded as an error and the run goes on with the tests after it. Each run is
a session of its own: when it ends, every process still in it is stopped (and counted),
and shared-memory segments in ``/dev/shm`` that the run left are removed when they can be
told apart from other programs' (the segment names carry their creator's pid).

The suite needs packages that stoker does not: ``expecttest`` (imported by torch's test
utilities) and ``psutil``; the script says what to install when they are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

LOADERS = ("torch", "stoker")
_REQUIRED = {  # import name -> what to pip install
    "pytest": "pytest",
    "pytest_timeout": "pytest-timeout",
    "expecttest": "expecttest",
    "psutil": "psutil",
    "torch": "torch",
    "stoker": "stoker",
}
_RAW_URL = "https://raw.githubusercontent.com/pytorch/pytorch/v{version}/test/test_dataloader.py"
_DEFAULT_TIMEOUT_S = 180
_MAX_RESUMES = 8  # pytest restarts after a test crashed the test process
_SETTLE_S = 10.0  # how long a finished run's processes get to exit by themselves
_TERM_WAIT_S = 3.0
_SHM_DIR = Path("/dev/shm")
_PID_IN_NAME = re.compile(r"^(?:stoker-|__KMP_REGISTERED_LIB_)(\d+)")

# Runs at start-up in every Python process that has the throwaway folder on PYTHONPATH.
_SITECUSTOMIZE = '''\
"""Replaces torch.utils.data.DataLoader by stoker.torch.DataLoader (torch_dataloader_suite)."""
import importlib.abc
import importlib.util
import os
import sys


def _patch():
    """Swaps the loaders once torch and stoker.torch are both fully imported.

    A spawned worker can import torch *while* it imports stoker.torch (to unpickle the
    dataset): the patch then waits until stoker.torch has finished.
    """
    stoker_torch = sys.modules.get("stoker.torch")
    if stoker_torch is not None and not hasattr(stoker_torch, "DataLoader"):
        return  # stoker.torch is being imported: its own hook patches when it is done
    import torch.utils.data
    import torch.utils.data.dataloader
    from stoker.torch import DataLoader

    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader


class _AfterImport(importlib.abc.MetaPathFinder):
    """Lets `import torch` (and `import stoker.torch`) run as usual, then patches."""

    def __init__(self):
        self.waiting = {"torch", "stoker.torch"}

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        if not self.waiting:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch()

        spec.loader.exec_module = exec_then_patch
        return spec


if os.environ.get("STOKER_SUITE_LOADER") == "stoker":
    if "torch" in sys.modules:
        _patch()
    else:
        sys.meta_path.insert(0, _AfterImport())
'''

# A pytest plugin that appends one JSON line per test event, flushed at once, so the
# results of a run survive a test that kills the test process.
_REPORT_PLUGIN = '''\
"""Writes each test's outcome as a JSON line (torch_dataloader_suite)."""
import json
import os

_PATH = os.environ["STOKER_SUITE_REPORT"]


def _write(record):
    with open(_PATH, "a") as f:
        f.write(json.dumps(record) + "\\n")


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    else:
        text = str(report.longrepr or "")
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


# pytest (9) reports each failed unittest subTest on its own and then the test itself as
# passed: a test counts as failed here when one of its subTests failed.
_failed_subtests = {}


def pytest_runtest_logreport(report):
    if hasattr(report, "context") and hasattr(report, "_sub_test_description"):  # a subTest
        if report.failed:
            where = report._sub_test_description()
            _failed_subtests.setdefault(report.nodeid, []).append(f"{where}: {_first_line(report)}")
        return
    failed = _failed_subtests.pop(report.nodeid, None) if report.when == "call" else None
    if failed and report.passed:
        _write({"event": "call", "nodeid": report.nodeid, "outcome": "failed",
                "duration": report.duration,
                "message": f"{len(failed)} subtest(s) failed, the first {failed[0]}"})
        return
    record = {"event": report.when, "nodeid": report.nodeid, "outcome": report.outcome,
              "duration": report.duration}
    if hasattr(report, "wasxfail"):
        record["xfail"] = True
    if report.outcome != "passed":
        record["message"] = _first_line(report)
    _write(record)
'''


@dataclass
class TestResult:
    outcome: str  # passed, failed, error, skipped, xfailed, xpassed
    message: str = ""
    duration: float = 0.0


@dataclass
class RunResult:
    loader: str
    tests: dict[str, TestResult] = field(default_factory=dict)
    seconds: float = 0.0
    stopped_processes: list[str] = field(default_factory=list)
    removed_segments: list[str] = field(default_factory=list)
    foreign_segments: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
        for result in self.tests.values():
            counts[result.outcome] += 1
        return counts


# --------------------------------------------------------------------------- the test file


def missing_packages() -> list[str]:
    return [pip for name, pip in _REQUIRED.items() if importlib.util.find_spec(name) is None]


def torch_version() -> str:
    import torch

    return torch.__version__.split("+", 1)[0]


def cache_dir() -> Path:
    root = os.environ.get("STOKER_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "stoker"


def fetch_test_file(version: str) -> Path:
    """The test file for torch ``version``, downloaded once into the cache."""
    target = cache_dir() / "torch-suite" / f"test_dataloader-v{version}.py"
    if target.exists():
        return target
    url = _RAW_URL.format(version=version)
    print(f"downloading {url}", flush=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read()
    except OSError as exc:
        msg = (
            f"could not download PyTorch's test file for torch {version} from {url}: {exc}. "
            "Download it yourself (or take it from a PyTorch checkout at that tag) and pass "
            "--test-file PATH."
        )
        raise SystemExit(msg) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(text)
    partial.replace(target)
    return target


# --------------------------------------------------------------------------- processes and /dev/shm


def session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, name) of every live process in session ``sid`` (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append((int(entry), name))
    return members


def stop_session(sid: int) -> list[str]:
    """Waits for the session's processes to exit, then stops the rest; returns what it stopped."""
    deadline = time.monotonic() + _SETTLE_S
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    stopped = [f"{name} (pid {pid})" for pid, name in session_members(sid)]
    for sig, wait in ((signal.SIGTERM, _TERM_WAIT_S), (signal.SIGKILL, _TERM_WAIT_S)):
        members = session_members(sid)
        if not members:
            break
        for pid, _name in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return stopped


def shm_names() -> set[str]:
    try:
        return set(os.listdir(_SHM_DIR))
    except OSError:
        return set()


def clean_shm(before: set[str]) -> tuple[list[str], list[str]]:
    """Removes segments that appeared during the run and whose creator is dead.

    Returns (removed, foreign): ``foreign`` are new entries without a creator's pid in
    their name, which may belong to another program; they stay. An entry whose creator
    is alive belongs to another program (the run's processes are stopped by now).
    """
    import psutil  # one of the suite's own requirements

    removed, foreign = [], []
    for name in sorted(shm_names() - before):
        match = _PID_IN_NAME.match(name)
        if match is None:
            foreign.append(name)
            continue
        if psutil.pid_exists(
            int(match.group(1))
        ):  # the run's processes are gone: another program's
            continue
        with contextlib.suppress(FileNotFoundError):
            (_SHM_DIR / name).unlink()
        removed.append(name)
    return removed, foreign


# --------------------------------------------------------------------------- running pytest


def collect(
    test_file: Path, env: dict[str, str], select: str | None, timeout_s: float
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(test_file),
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    if select:
        command += ["-k", select]
    done = subprocess.run(
        command, env=env, cwd=test_file.parent, capture_output=True, text=True, timeout=timeout_s
    )
    nodeids = [
        line.strip()
        for line in done.stdout.splitlines()
        if "::" in line and not line.startswith(" ")
    ]
    if not nodeids:
        msg = f"pytest collected no test from {test_file} (exit {done.returncode}):\n" + (
            done.stdout[-3000:] + done.stderr[-3000:]
        )
        raise SystemExit(msg)
    return nodeids


def read_report(path: Path) -> tuple[dict[str, TestResult], str | None]:
    """Outcomes so far, and the test that started last without finishing (or None)."""
    results: dict[str, TestResult] = {}
    running: str | None = None
    if not path.exists():
        return results, None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        nodeid, event = record["nodeid"], record["event"]
        if event == "start":
            running = nodeid
            continue
        outcome, message = record["outcome"], record.get("message", "")
        result = results.get(nodeid)
        if event == "setup":
            if outcome == "failed":
                results[nodeid] = TestResult("error", message, record["duration"])
            elif outcome == "skipped":
                results[nodeid] = TestResult(
                    "xfailed" if record.get("xfail") else "skipped", message
                )
        elif event == "call":
            if record.get("xfail"):
                kind = "xfailed" if outcome == "skipped" else "xpassed"
            else:
                kind = {"passed": "passed", "failed": "failed", "skipped": "skipped"}[outcome]
            results[nodeid] = TestResult(kind, message, record["duration"])
        elif event == "teardown":
            running = None
            if outcome == "failed" and (result is None or result.outcome == "passed"):
                results[nodeid] = TestResult("error", "teardown: " + message, record["duration"])
    return results, running


def run_suite(
    loader: str,
    test_file: Path,
    folder: Path,
    nodeids: list[str],
    select: str | None,
    timeout_s: float,
    verbose: bool,
) -> RunResult:
    """Runs ``nodeids`` with ``loader``; restarts pytest after a test that crashes it.

    The first pytest gets the file (and ``-k select``); a restart gets the tests left.
    """
    env = suite_env(folder, loader)
    report = folder / f"report-{loader}.jsonl"
    report.unlink(missing_ok=True)
    env["STOKER_SUITE_REPORT"] = str(report)
    run = RunResult(loader)
    shm_before = shm_names()
    began = time.monotonic()
    remaining = list(nodeids)
    targets = [test_file.name, *(["-k", select] if select else [])]
    for _attempt in range(_MAX_RESUMES + 1):
        command = [
            sys.executable, "-m", "pytest", *targets,
            "-p", "no:cacheprovider", "-p", "_suite_report",
            f"--timeout={timeout_s:g}", "-o", "timeout_method=signal",
            "-q", "-rN", "--no-header", "--tb=no",
        ]  # fmt: skip
        output = None if verbose else subprocess.DEVNULL
        process = subprocess.Popen(
            command,
            env=env,
            cwd=test_file.parent,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
        # a run past every test's limit is stuck outside any test: stop it
        limit = timeout_s * (len(remaining) + 2)
        try:
            process.wait(limit)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        run.stopped_processes += stop_session(process.pid)
        results, crashed = read_report(report)
        if crashed is not None and crashed not in results:
            code = process.returncode
            results[crashed] = TestResult(
                "error", f"the test process died during this test (exit status {code})"
            )
            with open(report, "a") as f:  # remembered across restarts
                f.write(
                    json.dumps(
                        {
                            "event": "call",
                            "nodeid": crashed,
                            "outcome": "failed",
                            "duration": 0.0,
                            "message": results[crashed].message,
                        }
                    )
                    + "\n"
                )
        remaining = [n for n in nodeids if n not in results]
        targets = remaining
        run.tests = results
        if not remaining:
            break
        if crashed is None:  # pytest stopped between tests: nothing to blame, do not loop
            break
    for nodeid in nodeids:
        run.tests.setdefault(
            nodeid, TestResult("error", "not run: the test process kept dying before it")
        )
    run.seconds = time.monotonic() - began
    run.removed_segments, run.foreign_segments = clean_shm(shm_before)
    return run


def suite_env(folder: Path, loader: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])
    env["STOKER_SUITE_LOADER"] = loader
    env.pop("PYTEST_ADDOPTS", None)
    return env


def make_folder(test_file: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="stoker-torch-suite-"))
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (folder / "_suite_report.py").write_text(_REPORT_PLUGIN)
    tests = folder / "tests"
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no other configuration applies
    shutil.copyfile(test_file, tests / test_file.name)
    return tests / test_file.name


def check_replacement(folder: Path) -> None:
    """The stoker run's processes really get stoker's loader (else the comparison is void)."""
    probe = (
        "import torch.utils.data as d; print(*(c.__module__.split('.')[0] + '.' + "
        "c.__module__.split('.')[1] for c in (d.DataLoader, d.dataloader.DataLoader)))"
    )
    for loader, expected in (
        ("stoker", "stoker.torch stoker.torch"),
        ("torch", "torch.utils torch.utils"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=suite_env(folder, loader),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.stdout.strip() != expected:
            msg = (
                f"the {loader} run would not use the loader it should: a child process sees "
                f"{done.stdout.strip()!r}, expected {expected!r}.\n{done.stderr[-3000:]}"
            )
            raise SystemExit(msg)


# --------------------------------------------------------------------------- report


def short(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def print_report(runs: dict[str, RunResult], test_file: Path, version: str) -> list[str]:
    print(f"\nPyTorch test/test_dataloader.py ({test_file}), torch {version}")
    columns = ("passed", "failed", "error", "skipped", "xfailed")
    print(f"  {'loader':<8}" + "".join(f"{c:>9}" for c in (*columns, "total", "time")))
    for name, run in runs.items():
        counts = run.counts()
        cells = "".join(f"{counts[c]:>9}" for c in columns)
        print(f"  {name:<8}{cells}{len(run.tests):>9}{run.seconds:>8.0f}s")
    for name, run in runs.items():
        if run.stopped_processes:
            print(
                f"  {name} run: {len(run.stopped_processes)} process(es) still running after it, "
                f"stopped: {', '.join(run.stopped_processes[:8])}"
            )
        if run.removed_segments:
            print(
                f"  {name} run: removed {len(run.removed_segments)} segment(s) it left in "
                f"/dev/shm: {', '.join(run.removed_segments[:8])}"
            )
        if run.foreign_segments:
            print(
                f"  {name} run: {len(run.foreign_segments)} new /dev/shm entr(ies) of unknown "
                f"origin, left alone: {', '.join(run.foreign_segments[:8])}"
            )
    regressions: list[str] = []
    if "torch" in runs and "stoker" in runs:
        reference, candidate = runs["torch"].tests, runs["stoker"].tests
        bad = ("failed", "error")
        regressions = [
            n
            for n in reference
            if reference[n].outcome == "passed" and candidate.get(n) and candidate[n].outcome in bad
        ]
        print(f"\nPass with torch, fail with stoker ({len(regressions)}):")
        for nodeid in regressions:
            result = candidate[nodeid]
            print(f"  {short(nodeid)}  [{result.outcome}]")
            print(
                textwrap.indent(textwrap.shorten(result.message, 200, placeholder=" ..."), "      ")
            )
        gains = [
            n
            for n in reference
            if reference[n].outcome in bad and candidate.get(n) and candidate[n].outcome == "passed"
        ]
        if gains:
            print(
                f"\nFail with torch, pass with stoker ({len(gains)}): "
                + ", ".join(map(short, gains))
            )
    for name, run in runs.items():
        if name == "stoker" and "torch" in runs:
            continue  # its failures that matter are listed above
        broken = [n for n, r in run.tests.items() if r.outcome in ("failed", "error")]
        if broken:
            print(f"\nFailing with {name} ({len(broken)}):")
            for nodeid in broken:
                print(f"  {short(nodeid)}: {textwrap.shorten(run.tests[nodeid].message, 160)}")
    return regressions


def write_json(
    path: Path, runs: dict[str, RunResult], test_file: Path, version: str, regressions: list[str]
) -> None:
    data = {
        "torch_version": version,
        "test_file": str(test_file),
        "test_file_sha256": hashlib.sha256(test_file.read_bytes()).hexdigest(),
        "runs": {
            name: {
                "counts": run.counts(),
                "seconds": round(run.seconds, 1),
                "stopped_processes": run.stopped_processes,
                "removed_segments": run.removed_segments,
                "foreign_segments": run.foreign_segments,
                "tests": {n: vars(r) for n, r in run.tests.items()},
            }
            for name, run in runs.items()
        },
        "pass_with_torch_fail_with_stoker": regressions,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--test-file", type=Path, help="PyTorch's test/test_dataloader.py (default: download it)"
    )
    parser.add_argument(
        "--loaders", default=",".join(LOADERS), help="comma-separated: torch, stoker (default both)"
    )
    parser.add_argument(
        "-k", dest="select", help="pytest -k expression: run only the matching tests"
    )
    parser.add_argument(
        "--timeout", type=float, default=_DEFAULT_TIMEOUT_S, help="seconds per test (default 180)"
    )
    parser.add_argument("--json", type=Path, help="write every test's result to this file")
    parser.add_argument("--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)

    missing = missing_packages()
    if missing:
        print(
            "The suite needs packages that are not installed in this environment: "
            f"{', '.join(missing)}.\nThey belong to the benchmark, not to stoker; install them "
            f"with\n    {sys.executable} -m pip install {' '.join(missing)}\n(keep the installed "
            "torch: pass pip a constraints file that pins it, e.g. -c <(echo torch==$(python -c "
            "'import torch; print(torch.__version__)'))).",
            file=sys.stderr,
        )
        return 2
    loaders = [name.strip() for name in args.loaders.split(",") if name.strip()]
    unknown = sorted(set(loaders) - set(LOADERS))
    if unknown or not loaders:
        parser.error(f"--loaders takes {', '.join(LOADERS)}; got {args.loaders!r}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    version = torch_version()
    source = args.test_file if args.test_file is not None else fetch_test_file(version)
    if not source.is_file():
        parser.error(f"--test-file {source} does not exist")

    test_file = make_folder(source.resolve())
    folder = test_file.parent.parent
    try:
        check_replacement(folder)
        nodeids = collect(test_file, suite_env(folder, "torch"), args.select, timeout_s=600)
        print(f"{len(nodeids)} tests in {source}; per-test limit {args.timeout:g} s", flush=True)
        runs: dict[str, RunResult] = {}
        for loader in loaders:
            print(f"running with {loader}'s DataLoader ...", flush=True)
            runs[loader] = run_suite(
                loader, test_file, folder, nodeids, args.select, args.timeout, args.verbose
            )
        regressions = print_report(runs, source, version)
        if args.json is not None:
            write_json(args.json, runs, source, version, regressions)
            print(f"\nper-test results: {args.json}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
