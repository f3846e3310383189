"""Real training frameworks drive stoker.torch here, beside torch's own loader.

Every test is followed by the suite's leak check (``tests/conftest.py``), given longer
here: a framework stops its loaders, torch's worker processes among them, in its own time.
"""

from __future__ import annotations

import pytest

_SETTLE_S = 10.0


@pytest.fixture
def leak_settle_s() -> float:
    """How long the leftovers of a test here may take to go away."""
    return _SETTLE_S
