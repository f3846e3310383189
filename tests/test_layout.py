"""The tests mirror the source tree and collect the same under both pytest import modes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
TESTS = ROOT / "tests"
SOURCE = ROOT / "src" / "stoker"

# Test folders with no stoker subpackage of their name, and why.
OTHER_FOLDERS = {
    "harness": "helpers shared by every folder (leak checks, save/load round trips)",
    "benchmarks": "smoke runs of the scripts in benchmarks/",
    "frameworks": "stoker under accelerate, Lightning and Hugging Face datasets",
    "torch_integration": "stoker.torch: a tests/torch package would shadow torch itself",
    "ray_integration": "stoker's Ray workers: a tests/ray package would shadow ray itself",
}
RENAMED = {"torch": "torch_integration"}


def _collected(*options: str) -> list[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *options,
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_importlib_mode_collects_the_same_tests_as_prepend_mode() -> None:
    prepend = _collected("--import-mode=prepend")
    importlib = _collected("--import-mode=importlib")
    assert len(prepend) > 1000
    assert sorted(importlib) == sorted(prepend)


def _folders(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_every_subpackage_has_its_tests_in_the_folder_of_its_name() -> None:
    for package in sorted(_folders(SOURCE)):
        folder = TESTS / RENAMED.get(package, package)
        assert list(folder.glob("test_*.py")), f"stoker.{package} has no tests in {folder}"


def test_every_test_folder_is_a_package_named_after_a_subpackage() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    packages = _folders(SOURCE)
    for folder in sorted(folders):
        assert (TESTS / folder / "__init__.py").exists(), f"tests/{folder} needs an __init__.py"
        known = folder in packages or folder in OTHER_FOLDERS
        assert known, f"tests/{folder} matches no stoker subpackage; name it after the one it tests"
