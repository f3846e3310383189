"""Argument checks shared by every public entry point, with messages that say what to do.

Integers may be Python or numpy integers (as torch accepts them); booleans must be real
booleans (``"no"`` is not ``False``); a number of seconds must be finite or infinite,
never NaN. Each check returns the value in its plain Python type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["check_bool", "check_choice", "check_int", "check_seconds"]


def _with_hint(msg: str, hint: str) -> str:
    return f"{msg} ({hint})" if hint else msg


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = 0,
    hint: str = "",
    error: type[Exception] = ValueError,
    message: str | None = None,
) -> int:
    """``value`` as an ``int`` if it is an integer ``>= minimum``; else ``error`` naming it.

    ``message`` replaces the first words of the error (stoker.DataLoader uses torch's).

    Example:
        >>> check_int("batch_size", np.int64(8), minimum=1)
        8
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        head = message or f"{name} must be {kind}"
        raise error(_with_hint(f"{head}, got {value!r}", hint))
    return int(value)


def check_bool(name: str, value: Any, *, error: type[Exception] = TypeError) -> bool:
    """``value`` if it is ``True`` or ``False`` (numpy's included); else ``error`` naming it.

    Example:
        >>> check_bool("drop_last", np.True_)
        True
    """
    if not isinstance(value, (bool, np.bool_)):
        msg = f"{name} must be True or False, got {type(value).__name__}: {value!r}"
        raise error(msg)
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        msg = f"{name} must be one of {tuple(choices)}, got {value!r}"
        raise ValueError(msg)
    return value


def check_seconds(name: str, value: Any, *, hint: str = "", message: str | None = None) -> float:
    """``value`` as a float number of seconds ``>= 0`` (``inf`` allowed, ``NaN`` not)."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or math.isnan(value)
        or value < 0
    ):
        head = message or f"{name} must be a non-negative number of seconds"
        raise ValueError(_with_hint(f"{head}, got {value!r}", hint))
    return float(value)
