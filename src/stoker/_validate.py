"""Argument checks shared by every public entry point, with messages that say what to do.

Integers may be Python or numpy integers (as torch accepts them), never booleans;
booleans must be real booleans (``"no"`` is not ``False``); a number of seconds must be
finite or infinite, never NaN, and so must any other number. Each check returns the value
in its plain Python type. :func:`is_int` and :func:`is_number` are the tests behind
:func:`check_int` and :func:`check_number`, for checks of composite values (a size or a
pair of sizes, a count or a fraction, a mapping of amounts) that word their own message.
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
    "check_number",
    "check_optional_int",
    "check_seconds",
    "is_int",
    "is_number",
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


def is_number(value: Any) -> bool:
    """True for a Python or numpy integer or float, infinities included; False for NaN or a bool.

    Example:
        >>> is_number(np.float32(0.5)), is_number(float("nan")), is_number(False)
        (True, False, False)
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        return False
    return not math.isnan(value)


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


def check_number(
    name: str, value: Any, *, minimum: float = 0, above: bool = False, hint: str = ""
) -> float:
    """``value`` if it is a number ``>= minimum`` (``> minimum`` with ``above``), else ValueError.

    An integer comes back an ``int``, any other number a ``float``.

    Example:
        >>> check_number("num_cpus", np.float64(0.5)), check_number("num_cpus", np.int64(2))
        (0.5, 2)
    """
    if not is_number(value) or value < minimum or (above and value == minimum):
        kind = f"a number {'>' if above else '>='} {minimum:g}"
        raise ValueError(_with_hint(f"{name} must be {kind}, got {value!r}", hint))
    return int(value) if is_int(value) else float(value)


def check_seconds(name: str, value: Any, *, hint: str = "", message: str | None = None) -> float:
    """``value`` as a float number of seconds ``>= 0`` (``inf`` allowed, ``NaN`` not)."""
    if not is_number(value) or value < 0:
        head = message or f"{name} must be a non-negative number of seconds"
        raise ValueError(_with_hint(f"{head}, got {value!r}", hint))
    return float(value)
