"""torchdata's StatefulDataLoader tests, run against torchdata's loader and against stoker's.

The files of torchdata's ``test/stateful_dataloader/`` (0.11.0: test_state_dict.py,
test_sampler.py, test_incremental_state.py, test_hugging_face.py, test_dataloader.py) are
run twice each: once as they are (the reference) and once with
``torchdata.stateful_dataloader.StatefulDataLoader`` replaced by a thin subclass of
``stoker.torch.DataLoader``, in the test process *and in every Python process it starts*
(spawned and forkserver workers, ``subprocess`` children). Then a table: passed / failed /
errors / skipped per file and loader, and each test that passes with torchdata and fails
with stoker, with the first line of its failure.

    benchmarks/torchdata_env.sh --test-dir DIR                    # builds its venv once, runs
    benchmarks/torchdata_env.sh --test-dir DIR --files test_sampler.py,test_state_dict.py \
        -k Snapshot --loaders stoker --json out.json

``torchdata_env.sh`` runs this script in its own environment (torchdata, the packages its
tests import, torch from ``.ci/constraints.txt``), with stoker imported from ``src/``.

The tests are not part of this repository. Pass a copy with ``--test-dir``, e.g. from a
checkout of torchdata at the installed version's tag::

    git clone --depth 1 --branch v0.11.0 https://github.com/pytorch/data torchdata-src
    benchmarks/torchdata_env.sh --test-dir torchdata-src/test/stateful_dataloader

Without ``--test-dir`` the files for the installed torchdata (tag ``v<version>``) are
downloaded from raw.githubusercontent.com once, into ``$STOKER_CACHE/torchdata-suite``
(default ``~/.cache/stoker/torchdata-suite``).

The replacement (``_SWAP``) accepts the constructor keyword that only torchdata has,
``snapshot_every_n_steps``, and ignores it: stoker's loader takes no snapshot interval.
Everything else goes to ``stoker.torch.DataLoader`` unchanged. It reaches every process as
in ``torch_dataloader_suite.py``: a throwaway folder holding a ``sitecustomize.py`` goes
first on ``PYTHONPATH``; it waits for ``torchdata.stateful_dataloader`` to be imported,
then sets ``torchdata.stateful_dataloader.StatefulDataLoader`` and
``torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader``, so that
``from torchdata.stateful_dataloader import StatefulDataLoader`` gets stoker's. The
reference run has the same folder with the replacement switched off.

Running pytest, the per-test time limit (``--timeout``), restarts after a test that kills
the test process, and the clean-up of left-over processes and ``/dev/shm`` segments are
``torch_dataloader_suite.py``'s, each file a run of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_dataloader_suite as suite  # found through the sys.path entry just above

LOADERS = ("torchdata", "stoker")
FILES = (
    "test_state_dict.py",
    "test_sampler.py",
    "test_incremental_state.py",
    "test_hugging_face.py",
    "test_dataloader.py",
)
# import name -> what to pip install: the torch suite's, and torchdata
_REQUIRED = {**suite._REQUIRED, "torchdata": "torchdata"}
_REQUIRED_BY_FILE = {"test_state_dict.py": "parameterized", "test_hugging_face.py": "datasets"}
_RAW_URL = "https://raw.githubusercontent.com/pytorch/data/v{version}/test/stateful_dataloader/"
_COLUMNS = ("passed", "failed", "error", "skipped", "xfailed")
_BAD = ("failed", "error")

# stoker's loader under torchdata's name; imported (by sitecustomize) only in the stoker run.
_SWAP = '''\
"""stoker.torch.DataLoader under torchdata's name (torchdata_suite)."""
from typing import TypeVar

from stoker.torch import DataLoader

T = TypeVar("T")

# StatefulDataLoader's constructor keywords that stoker's has not: taken, then ignored
IGNORED_KEYWORDS = ("snapshot_every_n_steps",)


class StatefulDataLoader(DataLoader[T]):  # generic, as torchdata's: StatefulDataLoader[int]
    """Takes ``snapshot_every_n_steps`` and ignores it: stoker has no snapshot interval."""

    def __init__(self, *args, snapshot_every_n_steps=1, **kwargs):
        super().__init__(*args, **kwargs)
'''

# Runs at start-up in every Python process that has the throwaway folder on PYTHONPATH.
_SITECUSTOMIZE = '''\
"""Puts stoker's loader in the place of torchdata's StatefulDataLoader (torchdata_suite)."""
import importlib.abc
import importlib.util
import os
import sys

_PACKAGE = "torchdata.stateful_dataloader"


def _swap(package):
    from _torchdata_swap import StatefulDataLoader

    package.StatefulDataLoader = StatefulDataLoader
    package.stateful_dataloader.StatefulDataLoader = StatefulDataLoader


class _ThenSwap(importlib.abc.MetaPathFinder):
    """Leaves the import of torchdata.stateful_dataloader to the other finders, then swaps."""

    def find_spec(self, name, path=None, target=None):
        if name != _PACKAGE:
            return None
        sys.meta_path.remove(self)  # one package, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_swap(module):
            run_module(module)
            _swap(module)

        spec.loader.exec_module = run_then_swap
        return spec


if os.environ.get("STOKER_SUITE_LOADER") == "stoker":
    if _PACKAGE in sys.modules:
        _swap(sys.modules[_PACKAGE])
    else:
        sys.meta_path.insert(0, _ThenSwap())
'''


# --------------------------------------------------------------------------- the test files


def missing_packages(files: list[str]) -> list[str]:
    needed = dict(_REQUIRED)
    needed.update(
        (_REQUIRED_BY_FILE[f], _REQUIRED_BY_FILE[f]) for f in files if f in _REQUIRED_BY_FILE
    )
    return [pip for name, pip in needed.items() if importlib.util.find_spec(name) is None]


def torchdata_version() -> str:
    """The installed torchdata's version, read from its metadata (no import)."""
    try:
        return importlib.metadata.version("torchdata")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"  # a stand-in package without metadata (tests/benchmarks)


def stoker_source() -> str:
    """Where stoker is imported from, with the git commit when that is a checkout."""
    spec = importlib.util.find_spec("stoker")
    where = Path(spec.origin).parent.parent if spec and spec.origin else Path(".")
    done = subprocess.run(
        ["git", "-C", str(where), "log", "-1", "--format=%h"], capture_output=True, text=True
    )
    commit = done.stdout.strip()
    return f"{where} (commit {commit})" if done.returncode == 0 and commit else str(where)


def fetch_test_dir(version: str, files: list[str]) -> Path:
    """The test files for torchdata ``version``, downloaded once into the cache."""
    target = suite.cache_dir() / "torchdata-suite" / f"v{version}"
    target.mkdir(parents=True, exist_ok=True)
    for name in (f for f in files if not (target / f).exists()):
        url = _RAW_URL.format(version=version) + name
        print(f"downloading {url}", flush=True)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                (target / f"{name}.part").write_bytes(response.read())
        except OSError as exc:
            msg = (
                f"could not download torchdata's {name} from {url}: {exc}. Get the tests "
                f"from a checkout of torchdata at tag v{version}:\n    git clone --depth 1 "
                f"--branch v{version} https://github.com/pytorch/data torchdata-src\nand pass "
                "--test-dir torchdata-src/test/stateful_dataloader."
            )
            raise SystemExit(msg) from None
        (target / f"{name}.part").replace(target / name)
    return target


def make_folder(folder: Path, test_dir: Path, files: list[str]) -> None:
    """Fills the throwaway ``folder``: sitecustomize, the swap, the report plugin, tests/."""
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (folder / "_torchdata_swap.py").write_text(_SWAP)
    (folder / "_suite_report.py").write_text(suite._REPORT_PLUGIN)
    tests = folder / "tests"
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no other configuration applies
    for name in files:
        shutil.copyfile(test_dir / name, tests / name)


def check_replacement(folder: Path) -> None:
    """The stoker run's processes really get stoker's loader (else the comparison is void)."""
    probe = (
        "import torchdata.stateful_dataloader as s, stoker.torch as t\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader as imported\n"
        "for c in (s.StatefulDataLoader, s.stateful_dataloader.StatefulDataLoader, imported):\n"
        "    print(c.__module__ + '.' + c.__qualname__, issubclass(c, t.DataLoader))"
    )
    swapped = "_torchdata_swap.StatefulDataLoader True"
    for loader in LOADERS:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=suite.suite_env(folder, loader),
            capture_output=True,
            text=True,
            timeout=300,
        )
        seen = done.stdout.splitlines()
        if len(seen) != 3 or (set(seen) == {swapped}) != (loader == "stoker"):
            msg = (
                f"the {loader} run would not use the loader it should: a child process sees "
                f"{seen!r} (class, is stoker's) where stoker's should be {swapped!r} in the "
                f"stoker run only.\n{done.stderr[-3000:]}"
            )
            raise SystemExit(msg)


# --------------------------------------------------------------------------- running


def collect_by_file(folder: Path, files: list[str], select: str | None) -> dict[str, list[str]]:
    """The test ids of each file (an empty list: nothing matched ``-k``, or it did not import)."""
    env = suite.suite_env(folder, "torchdata")
    nodeids = suite.collect(folder / "tests", env, select, timeout_s=600)
    return {
        name: list(dict.fromkeys(n for n in nodeids if n.startswith(f"{name}::"))) for name in files
    }


def run_files(
    folder: Path, by_file: dict[str, list[str]], loaders: list[str], args: argparse.Namespace
) -> dict[str, dict[str, suite.RunResult]]:
    """Each file with each loader in turn (both loaders on one file before the next file)."""
    runs: dict[str, dict[str, suite.RunResult]] = {}
    for name, nodeids in by_file.items():
        if not nodeids:
            print(f"{name}: no test collected, skipped", flush=True)
            continue
        runs[name] = {}
        for loader in loaders:
            test_file = folder / "tests" / name
            run = suite.run_suite(
                loader, test_file, folder, nodeids, args.select, args.timeout, args.verbose
            )
            runs[name][loader] = run
            counts = ", ".join(f"{n} {c}" for c, n in run.counts().items() if n)
            print(f"{name} with {loader}: {counts} ({run.seconds:.0f} s)", flush=True)
    return runs


# --------------------------------------------------------------------------- report


def differences(
    runs: dict[str, dict[str, suite.RunResult]], reference: tuple[str, ...], stoker: tuple[str, ...]
) -> list[str]:
    """The tests whose outcome is in ``reference`` with torchdata and in ``stoker`` with stoker."""
    return [
        nodeid
        for pair in runs.values()
        if "torchdata" in pair and "stoker" in pair
        for nodeid, result in pair["torchdata"].tests.items()
        if result.outcome in reference and pair["stoker"].tests[nodeid].outcome in stoker
    ]


def totals(
    runs: dict[str, dict[str, suite.RunResult]], loader: str
) -> tuple[dict[str, int], int, float]:
    counts = dict.fromkeys(_COLUMNS, 0)
    tests, seconds = 0, 0.0
    for pair in runs.values():
        if loader in pair:
            for column, n in pair[loader].counts().items():
                counts[column] = counts.get(column, 0) + n
            tests, seconds = tests + len(pair[loader].tests), seconds + pair[loader].seconds
    return counts, tests, seconds


def _row(label: str, loader: str, counts: dict[str, int], tests: int, seconds: float) -> str:
    return (
        f"  {label:<28}{loader:<10}"
        + "".join(f"{counts[c]:>9}" for c in _COLUMNS)
        + (f"{tests:>9}{seconds:>8.0f}s")
    )


def print_table(
    runs: dict[str, dict[str, suite.RunResult]], header: str, loaders: list[str]
) -> None:
    print(f"\n{header}")
    print(
        f"  {'file':<28}{'loader':<10}" + "".join(f"{c:>9}" for c in (*_COLUMNS, "total", "time"))
    )
    for name, pair in runs.items():
        for i, (loader, run) in enumerate(pair.items()):
            print(_row("" if i else name, loader, run.counts(), len(run.tests), run.seconds))
    if len(runs) > 1:
        for i, loader in enumerate(loaders):
            print(_row("" if i else f"all {len(runs)} files", loader, *totals(runs, loader)))
    notes = (
        ("stopped_processes", "process(es) still running after it, stopped"),
        ("removed_segments", "segment(s) it left in /dev/shm, removed"),
        ("foreign_segments", "new /dev/shm entr(ies) of unknown origin, left alone"),
    )
    for name, pair in runs.items():
        for loader, run in pair.items():
            for attribute, what in notes:
                if items := getattr(run, attribute):
                    print(f"  {name} {loader} run: {len(items)} {what}: {', '.join(items[:8])}")


def print_differences(runs: dict[str, dict[str, suite.RunResult]], loaders: list[str]) -> list[str]:
    """Lists the tests that pass with torchdata only (returned), then the other way round."""
    stoker = {
        n: r for pair in runs.values() if "stoker" in pair for n, r in pair["stoker"].tests.items()
    }
    regressions = differences(runs, ("passed",), _BAD)
    if "torchdata" in loaders and "stoker" in loaders:
        print(f"\nPass with torchdata, fail with stoker ({len(regressions)}):")
        for nodeid in regressions:
            print(f"  {nodeid}  [{stoker[nodeid].outcome}]")
            message = textwrap.shorten(stoker[nodeid].message, 200, placeholder=" ...")
            print(textwrap.indent(message, "      "))
        gains = differences(runs, _BAD, ("passed",))
        if gains:
            print(f"\nFail with torchdata, pass with stoker ({len(gains)}): " + ", ".join(gains))
    for loader in loaders:
        if loader == "stoker" and "torchdata" in loaders:
            continue  # its failures that matter are listed above
        broken = [
            (n, r)
            for pair in runs.values()
            for n, r in pair[loader].tests.items()
            if r.outcome in _BAD
        ]
        if broken:
            print(f"\nFailing with {loader} ({len(broken)}):")
            for nodeid, result in broken:
                print(f"  {nodeid}: {textwrap.shorten(result.message, 160)}")
    return regressions


def describe(versions: dict[str, str], source: Path) -> str:
    return (
        f"torchdata {versions['torchdata_version']} test/stateful_dataloader ({source}), "
        f"torch {versions['torch_version']}, stoker from {versions['stoker']}"
    )


def write_json(
    path: Path,
    runs: dict[str, dict[str, suite.RunResult]],
    versions: dict[str, str],
    test_dir: Path,
    regressions: list[str],
) -> None:
    data = {
        **versions,
        "test_dir": str(test_dir),
        "files": {
            name: {
                "sha256": hashlib.sha256((test_dir / name).read_bytes()).hexdigest(),
                "runs": {
                    loader: {"counts": run.counts(), **asdict(run)} for loader, run in pair.items()
                },
            }
            for name, pair in runs.items()
        },
        "pass_with_torchdata_fail_with_stoker": regressions,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


# --------------------------------------------------------------------------- main


def _names(
    value: str, known: tuple[str, ...] | None, option: str, parser: argparse.ArgumentParser
) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted(set(names) - set(known)) if known else []
    if unknown or not names:
        kinds = ", ".join(known) if known else "file names"
        parser.error(f"{option} takes a comma-separated list of {kinds}; got {value!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--test-dir", type=Path, help="torchdata's test/stateful_dataloader (default: download it)"
    )
    parser.add_argument(
        "--files",
        default=",".join(FILES),
        help="comma-separated test files in it (default: the five)",
    )
    parser.add_argument(
        "--loaders",
        default=",".join(LOADERS),
        help="comma-separated: torchdata, stoker (default both)",
    )
    parser.add_argument(
        "-k", dest="select", help="pytest -k expression: run only the matching tests"
    )
    parser.add_argument("--timeout", type=float, default=180, help="seconds per test (default 180)")
    parser.add_argument("--json", type=Path, help="write every test's result to this file")
    parser.add_argument("--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)
    files = _names(args.files, None, "--files", parser)
    loaders = _names(args.loaders, LOADERS, "--loaders", parser)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")

    missing = missing_packages(files)
    if missing:
        print(
            "The suite needs packages that are not installed in this environment: "
            f"{', '.join(missing)}.\nThey belong to the benchmark, not to stoker: "
            "benchmarks/torchdata_env.sh builds an environment that has them all and runs "
            "this script in it.",
            file=sys.stderr,
        )
        return 2
    versions = {
        "torchdata_version": torchdata_version(),
        "torch_version": suite.torch_version(),
        "stoker": stoker_source(),
    }
    source = (
        args.test_dir
        if args.test_dir is not None
        else fetch_test_dir(versions["torchdata_version"], files)
    )
    absent = [name for name in files if not (source / name).is_file()]
    if absent:
        parser.error(f"--test-dir {source} has no {', '.join(absent)}")

    with tempfile.TemporaryDirectory(
        prefix="stoker-torchdata-suite-", ignore_cleanup_errors=True
    ) as tmp:
        folder = Path(tmp)
        make_folder(folder, source.resolve(), files)
        check_replacement(folder)
        by_file = collect_by_file(folder, files, args.select)
        count, limit = sum(map(len, by_file.values())), f"per-test limit {args.timeout:g} s"
        print(f"{count} tests in {len(files)} file(s) of {source}; {limit}", flush=True)
        began = time.monotonic()
        runs = run_files(folder, by_file, loaders, args)
    print_table(
        runs, f"{describe(versions, source)}; {time.monotonic() - began:.0f} s in all", loaders
    )
    regressions = print_differences(runs, loaders)
    if args.json is not None:
        write_json(args.json, runs, versions, source.resolve(), regressions)
        print(f"\nper-test results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
