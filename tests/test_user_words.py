"""What users read speaks of stoker and its users: no words from how the project is run.

README, docs, BENCHMARKS.md, every docstring and message in the package and in the
benchmark scripts (their output is what BENCHMARKS.md quotes), and every ``--help`` the
command line prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# phrases that only make sense inside the team: where requirements came from, how work is organised
INSIDER = re.compile(
    r"\bthe seeds (?:describe|ran|run|kept|keep|list|did|do|say|said|use|used|show|measured)\b"
    r"|\bseeds'|\bseed articles?\b|\bthe (?:first|second|third) seed\b|\bas in the seed\b(?!-)"
    r"|\bmachine kind\b|\bthe issue\b|(?<!PyTorch )(?<!torch )\bissue \d+\b|\bsession \d+\b"
    r"|\bthis task\b",
    re.IGNORECASE,
)
SUBCOMMANDS = ["demo", "pack", "doctor", "bench"]


def user_texts() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    files += sorted((ROOT / "src" / "stoker").glob("**/*.py"))
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    return files


def insider_phrases(text: str) -> list[str]:
    found = []
    for match in INSIDER.finditer(text):
        line = text[: match.start()].count("\n") + 1
        found.append(f"line {line}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize("path", user_texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_insider_words_in_what_users_read(path: Path) -> None:
    assert insider_phrases(path.read_text(encoding="utf-8")) == []


def test_every_help_page_speaks_to_users() -> None:
    pages = {}
    for command in [[], *([c] for c in SUBCOMMANDS)]:
        result = subprocess.run(
            [sys.executable, "-m", "stoker.cli", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        pages[" ".join(["stoker", *command])] = result.stdout
    assert all(len(page) > 200 for page in pages.values())
    problems = {
        name: insider_phrases(page) for name, page in pages.items() if insider_phrases(page)
    }
    assert problems == {}


def test_the_rule_catches_what_it_is_for() -> None:
    assert insider_phrases("as the seeds describe") and insider_phrases("the third seed tunes")
    assert insider_phrases("the CPU build this machine kind keeps") and insider_phrases(
        "see issue 12"
    )
    assert not insider_phrases("the seed of the sampler; PyTorch issue 13246; the seeds are drawn")
    assert not insider_phrases("keeps the seed\nthe seed-like arguments (torch issue 13246)")


def test_the_benchmark_scripts_are_read_too() -> None:
    read = {p.relative_to(ROOT).as_posix() for p in user_texts()}
    assert "benchmarks/bench_memory.py" in read and "benchmarks/bench_peers.py" in read
