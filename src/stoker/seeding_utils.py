"""Deprecated: ``seed_everything`` lives in :mod:`stoker.seeding` (and :mod:`stoker`).

``from stoker.seeding_utils import seed_everything`` still works until stoker 0.3, with a
``DeprecationWarning``; import it from :mod:`stoker.seeding` or :mod:`stoker` instead.
"""

from __future__ import annotations

from typing import Any

from stoker._deprecated import Moved, moved_attribute

__all__ = ["seed_everything"]  # noqa: F822 (served, with a warning, by __getattr__)

_MOVED = {
    "seed_everything": Moved(
        "stoker.seeding",
        "import seed_everything from stoker.seeding (or stoker) instead",
        whole_module=True,
    ),
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, _MOVED, name)
