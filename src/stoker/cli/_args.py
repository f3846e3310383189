"""Option types the commands share: values out of range are usage errors from argparse.

Each is a ``type=`` for :meth:`argparse.ArgumentParser.add_argument`; a bad value ends
the command with argparse's usage line and exit status 2, before anything runs.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["int_between", "int_list", "nonnegative_float", "nonnegative_int", "positive_int"]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer of 1 or more."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``, both included."""

    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


def nonnegative_int(text: str) -> int:
    """An integer of 0 or more."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number of 0 or more (``inf`` and ``nan`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text}")
    return value


def int_list(minimum: int) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, each ``minimum`` or more (``"0,1,2,4"``)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            values = ()
        if not values:
            msg = f"expected comma-separated integers such as 0,1,2,4, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        if min(values) < minimum:
            raise argparse.ArgumentTypeError(f"each value must be {minimum} or more, got {text}")
        return values

    parse.__name__ = "integer list"  # argparse names the type in some messages
    return parse
