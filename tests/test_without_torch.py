"""The core works without torch: import-time isolation, and the core suite with torch hidden."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hidden import env_hiding

TESTS = Path(__file__).parent


def _env_without_torch(tmp_path: Path) -> dict[str, str]:
    """As on a machine without torch."""
    return env_hiding(tmp_path, ["torch"], note=" (hidden by the no-torch test)")


def test_import_stoker_does_not_import_torch() -> None:
    code = "import stoker, stoker.cli, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# Tests of code that never looks for torch run once, in the main suite, to keep the suite's
# time: process lifecycle and faults (signals, dead workers, exit), object storage, file
# formats and streams, profiling and tuning (their packages never look for torch; the
# loader and engine code they run is rerun through the engine, collate and loader tests),
# the command line's exit codes, pipes and help pages, packing and the bench sweep, the
# demo (it needs torch), lint, layout, benchmarks, Ray.
_SAME_WITH_OR_WITHOUT_TORCH = re.compile(
    r"(storage|frameworks|benchmarks|ray_integration|formats|streams|profiling|tuning)/"
    r"|cli/test_(manners|demo|demo_cache|extras|bench|pack)\.py"
    r"|engine/test_engine_(faults|lifecycle|trainer_exit)\.py"
    r"|test_(lint|layout|user_words)\.py"
)


@pytest.mark.timeout(900)  # the core suite again, in a process of its own
def test_core_suite_passes_with_torch_hidden(tmp_path: Path) -> None:
    env = _env_without_torch(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
    )
    assert "hidden by the no-torch test" in probe.stderr
    core = sorted(
        str(p)
        for p in TESTS.rglob("test_*.py")
        if p.name != Path(__file__).name
        and not _SAME_WITH_OR_WITHOUT_TORCH.match(p.relative_to(TESTS).as_posix())
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *core],
        env=env,
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=900,
    )
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    # every torch-dependent module skipped with its stated reason, the rest passed
    assert " passed" in result.stdout, tail
    assert "the differential tests use torch.utils.data as the oracle" in result.stdout, tail
