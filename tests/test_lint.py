"""The code passes the project's ruff rules (pyproject.toml, [tool.ruff.lint]) and format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _ruff(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", "src", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ruff_finds_nothing() -> None:
    result = _ruff("check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
