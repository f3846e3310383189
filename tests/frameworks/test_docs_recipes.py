"""The recipes of docs/frameworks.md run as written, each group in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the recipes train torch models")
from frameworks.framework_harness import framework_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"
RECIPES = {
    m.group(1): m.group(0)
    for m in re.finditer(
        r"# recipe: ([\w-]+)\n.*?(?=```)", DOC.read_text(encoding="utf-8"), flags=re.S
    )
}
GROUPS = {
    "lightning": ("lightning-fit", "lightning-resume"),
    "accelerate": ("accelerate",),
    "datasets": ("datasets",),
}
_TIMEOUT_S = 300


def test_every_recipe_belongs_to_a_group() -> None:
    assert sorted(RECIPES) == sorted(name for names in GROUPS.values() for name in names)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_recipe_runs_as_written(group, tmp_path) -> None:
    pytest.importorskip(group, reason=f"the {group} recipes need {group}")
    script = tmp_path / f"recipe_{group}.py"  # not {group}.py, which would shadow the package
    script.write_text("\n".join(RECIPES[name] for name in GROUPS[group]), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=framework_env(),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    if group == "lightning":
        assert (tmp_path / "checkpoints" / "epoch=0-step=2.ckpt").exists()
