"""``SKIPPED``: what stands where a sample or a batch was left out, so none is handed on.

A reader's record skipped under ``on_error="skip"``, a batch whose samples were all
skipped, a worker's task answered with no batch (its stream had ended): each is marked
with this one value, tested with ``is``.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["SKIPPED"]


class _Marker(enum.Enum):
    SKIPPED = "skipped"  # an enum member: one value, a type of its own, pickled as itself


SKIPPED: Final = _Marker.SKIPPED
