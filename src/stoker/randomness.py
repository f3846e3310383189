"""Deprecated: ``sample_rng`` lives in :mod:`stoker.seeding` (and :mod:`stoker`).

``from stoker.randomness import sample_rng`` still works until stoker 0.3, with a
``DeprecationWarning``; import it from :mod:`stoker.seeding` or :mod:`stoker` instead.
:mod:`stoker.seeding` also tells how per-sample random scopes keep augmentations
independent of the workers. The scope machinery this module held (``begin``, ``end``,
``install`` and the rest) is internal to stoker's engine now.
"""

from __future__ import annotations

from typing import Any

from stoker._deprecated import Moved, moved_attribute

__all__ = ["sample_rng"]  # noqa: F822 (served, with a warning, by __getattr__)

_SCOPES = "stoker.engine.random_scopes"
_INTERNAL = (
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


def _internal(name: str) -> Moved:
    advice = (
        f"{name} is internal to stoker's engine and now lives in {_SCOPES}, which may change "
        "without notice; draw from stoker.sample_rng() or the global random functions instead"
    )
    return Moved(_SCOPES, advice, whole_module=True)


_MOVED = {
    "sample_rng": Moved(
        "stoker.seeding",
        "import sample_rng from stoker.seeding (or stoker) instead",
        whole_module=True,
    ),
    **{name: _internal(name) for name in _INTERNAL},
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, _MOVED, name)
