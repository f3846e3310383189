"""Argument checks shared by every public entry point, with messages that say what to do.

Integers may be Python or numpy integers (as torch accepts them), never booleans;
booleans must be real booleans (``"no"`` is not ``False``); a number of seconds must be
finite or infinite, never NaN. Each check returns the value in its plain Python type.
:func:`is_int` is the test behind :func:`check_int`, for checks of composite values (a
size or a pair of sizes, a count or a fraction) that word their own message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_optional_int",
    "check_seconds",
    "is_int",
]


def _with_hint(msg: str, hint: str) -> str:
    return f"{msg} ({hint})" if hint else msg


def is_int(value: Any) -> bool:
    """True for a Python or numpy integer; False for a bool (numpy's too) and anything else.

    Example:
        >>> is_int(np.uint8(3)), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_kind(minimum: int) -> str:
    if minimum == 1:
        return "a positive integer"
    return "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"


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
    if not is_int(value) or value < minimum:
        head = message or f"{name} must be {_int_kind(minimum)}"
        raise error(_with_hint(f"{head}, got {value!r}", hint))
    return int(value)


def check_optional_int(
    name: str, value: Any, *, minimum: int = 0, hint: str = "", error: type[Exception] = ValueError
) -> int | None:
    """:func:`check_int` that also lets ``None`` through (and says so in its message).

    Example:
        >>> check_optional_int("max_length", None, minimum=1) is None
        True
    """
    if value is None:
        return None
    message = f"{name} must be {_int_kind(minimum)} or None"
    return check_int(name, value, minimum=minimum, hint=hint, error=error, message=message)


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
