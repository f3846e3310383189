"""The README's Python examples run as written (its two commands are .ci/run's business)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_examples_and_both_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) >= 3
    assert (
        '.venv/bin/pip install -q -c .ci/constraints.txt -e ".[test]" && .venv/bin/python -m pytest'
        in text
    )
    assert (
        '.venv/bin/pip install -q -c .ci/constraints.txt -e ".[demo]" && .venv/bin/stoker demo'
        in text
    )
    ci = (README.parent / ".ci" / "run").read_text()
    assert (
        'python3 -m venv .venv && .venv/bin/pip install -q -c .ci/constraints.txt -e ".[test]" '
        "&& .venv/bin/python -m pytest" in ci
    )


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if "photos/" not in b], ids=lambda b: b.splitlines()[0][:40]
)
def test_readme_example_runs(block: str) -> None:
    if "import torch" in block or "stoker.torch" in block:
        pytest.importorskip(
            "torch", reason="this README example is the PyTorch one: it needs torch"
        )
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})
