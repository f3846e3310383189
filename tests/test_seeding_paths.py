"""stoker.seeding is the one home of seeding; the old import paths warn for one release.

``stoker.randomness``, ``stoker.seeding_utils`` and ``stoker.bad_samples.BadSampleBudget``
still give the very same objects, and each access warns with a ``DeprecationWarning`` that
names the old path and the new one. Importing the old module alone does not warn: asking
it for a name does.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
import stoker.seeding
from stoker._bad_sample_budget import BadSampleBudget, check_max_errors
from stoker.engine import random_scopes

SRC = Path(stoker.__file__).parent
REMOVED = r"is deprecated and will be removed in stoker 0\.3; "
ENGINE_NAMES = (
    "BATCH",
    "COLLATE",
    "GENERATORS",
    "SAMPLE",
    "begin",
    "end",
    "install",
    "leave_to_user",
    "seeding_watch",
)

OLD_PATHS = [
    pytest.param(
        "stoker.seeding_utils", "seed_everything", stoker.seeding.seed_everything,
        r"stoker\.seeding_utils " + REMOVED + r"import seed_everything from stoker\.seeding \(or "
                                              r"stoker\) instead",
        id="seeding_utils.seed_everything",
    ),
    pytest.param(
        "stoker.randomness", "sample_rng", stoker.seeding.sample_rng,
        r"stoker\.randomness " + REMOVED + r"import sample_rng from stoker\.seeding \(or stoker\) "
                                           r"instead",
        id="randomness.sample_rng",
    ),
    pytest.param(
        "stoker.bad_samples", "BadSampleBudget", BadSampleBudget,
        r"stoker\.bad_samples\.BadSampleBudget " + REMOVED + r"BadSampleBudget is internal to "
                                                             r"stoker's DataLoader .* pass "
                                                             r"on_error='skip' and max_errors= to "
                                                             r"the DataLoader and read "
                                                             r"loader\.error_report\(\) instead",
        id="bad_samples.BadSampleBudget",
    ),
    pytest.param(
        "stoker.bad_samples", "check_max_errors", check_max_errors,
        r"stoker\.bad_samples\.check_max_errors " + REMOVED + r"check_max_errors is internal",
        id="bad_samples.check_max_errors",
    ),
    *(
        pytest.param(
            "stoker.randomness", name, getattr(random_scopes, name),
            r"stoker\.randomness " + REMOVED + name + r" is internal to stoker's engine and now "
            r"lives in stoker\.engine\.random_scopes",
            id=f"randomness.{name}",
        )
        for name in ENGINE_NAMES
    ),
]  # fmt: skip


@pytest.mark.parametrize(("module", "name", "new", "message"), OLD_PATHS)
def test_an_old_path_gives_the_same_object_and_warns(module, name, new, message) -> None:
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=message) as caught:
        value = getattr(old, name)
    assert value is new
    assert [Path(w.filename) for w in caught] == [Path(__file__)], (
        "the warning points at the caller"
    )


def test_from_import_of_an_old_path_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match=r"stoker\.seeding_utils is deprecated"):
        from stoker.seeding_utils import seed_everything
    with pytest.warns(DeprecationWarning, match=r"stoker\.randomness is deprecated"):
        from stoker.randomness import sample_rng
    assert (seed_everything, sample_rng) == (stoker.seed_everything, stoker.sample_rng)


def test_importing_an_old_module_alone_does_not_warn() -> None:
    code = (
        "import stoker.randomness, stoker.seeding_utils, stoker.bad_samples\n"
        "try:\n"
        "    from stoker.randomness import sample_rng\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
    )
    result = _python("-W", "error::DeprecationWarning", "-c", code)
    assert result.stdout.startswith("stoker.randomness is deprecated"), result.stdout


def test_names_that_never_were_there_still_raise_attribute_error() -> None:
    import stoker.bad_samples
    import stoker.randomness

    for module in (stoker.randomness, stoker.bad_samples):
        with pytest.raises(AttributeError, match=r"has no attribute 'no_such_name'"):
            module.no_such_name  # noqa: B018 (the attribute access is the test)
    assert not hasattr(stoker.randomness, "_Scope"), "private names are not forwarded"


def test_seeding_is_the_public_home() -> None:
    assert stoker.seeding.__all__ == ["epoch_rng", "sample_rng", "seed_everything"]
    assert stoker.sample_rng is stoker.seeding.sample_rng
    assert stoker.seed_everything is stoker.seeding.seed_everything
    assert "BadSampleBudget" not in stoker.bad_samples.__all__


def test_the_seeding_docstring_tells_the_whole_story() -> None:
    doc = stoker.seeding.__doc__
    for topic in ("seed_everything", "generator=", "sample_rng", "worker_init_fn", "num_workers"):
        assert topic in doc, topic


def test_import_stoker_and_seeding_do_not_import_torch() -> None:
    code = "import sys, stoker, stoker.seeding; print('torch' in sys.modules)"
    assert _python("-c", code).stdout.strip() == "False"


def test_no_stoker_module_imports_a_deprecated_path() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {what}"
        for path in sorted(SRC.rglob("*.py"))
        for line, what in _deprecated_imports(path)
    ]
    assert not offenders, "\n".join(offenders)


def _deprecated_imports(path: Path) -> list[tuple[int, str]]:
    """Lines of ``path`` that import an old path (the shims themselves excepted)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name in _OLD or name.startswith(("stoker.randomness.", "stoker.seeding_utils.")):
                found.append((node.lineno, name))
    return found


_OLD = {
    "stoker.randomness",
    "stoker.seeding_utils",
    "stoker._seeding",
    "stoker.bad_samples.BadSampleBudget",
    "stoker.bad_samples.check_max_errors",
}


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
