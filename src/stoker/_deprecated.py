"""Old import paths that keep working for one release, with a ``DeprecationWarning``.

A module whose names moved lists them in a dict of :class:`Moved` and defines::

    def __getattr__(name: str) -> Any:
        return moved_attribute(__name__, _MOVED, name)

Each name it lists is then served from its new module, and every access (``from old
import name`` included) warns with a message that names the old path and the new one.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Moved", "moved_attribute"]

REMOVED_IN = "0.3"


@dataclass(frozen=True, slots=True)
class Moved:
    """Where a name lives now.

    Attributes:
        module: the module that defines it now.
        advice: what to do instead, when not "import it from ``module``" (for a name that
            left the public API).
        whole_module: the old module as a whole is deprecated, not only this name.
    """

    module: str
    advice: str = ""
    whole_module: bool = False

    def message(self, old_module: str, name: str) -> str:
        """The warning: the old path, the release that removes it, and the new path."""
        old = old_module if self.whole_module else f"{old_module}.{name}"
        advice = self.advice or f"import {name} from {self.module} instead"
        return f"{old} is deprecated and will be removed in stoker {REMOVED_IN}; {advice}"


def moved_attribute(old_module: str, moves: Mapping[str, Moved], name: str) -> Any:
    """What the old module's ``__getattr__`` returns for ``name``, with a warning.

    Args:
        old_module: the ``__name__`` of the module that keeps the old path.
        moves: each name that moved, and where to.
        name: the attribute asked for.

    Returns:
        The very object the new module holds, after a ``DeprecationWarning`` that points
        at the code that asked for it.

    Raises:
        AttributeError: ``name`` is not one of ``moves``.
    """
    moved = moves.get(name)
    if moved is None:
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
    # stacklevel 3: past this function and the module's __getattr__, to the caller
    warnings.warn(moved.message(old_module, name), DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(moved.module), name)
