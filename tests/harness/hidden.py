"""Child processes that run as on a machine without some packages installed.

:func:`env_hiding` writes a ``sitecustomize.py`` that makes importing the named packages
(and their submodules) fail with ``ModuleNotFoundError``, and returns an environment that
puts it first on a child's ``PYTHONPATH``: a real process that cannot import them, without
uninstalling anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["env_hiding"]

_SITECUSTOMIZE = """
import sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}{note}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def env_hiding(
    folder: Path, names: Iterable[str], *, note: str = "", path: Iterable[str] = ()
) -> dict[str, str]:
    """This process's environment, for a child in which ``names`` cannot be imported.

    ``folder`` receives the ``sitecustomize.py``; ``note`` is appended to the import error
    (a test can check the hiding took effect by it); ``path`` goes on ``PYTHONPATH`` after it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    source = _SITECUSTOMIZE.format(names=tuple(names), note=note)
    (folder / "sitecustomize.py").write_text(source, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), *path, env.get("PYTHONPATH")]))
    return env
