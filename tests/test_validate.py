"""The argument checks every public entry point shares (stoker._validate)."""

from __future__ import annotations

import numpy as np
import pytest

from stoker._validate import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_optional_int,
    check_seconds,
    is_int,
    is_number,
)


@pytest.mark.parametrize("value", [3, np.int8(3), np.uint64(3), np.int64(3)])
def test_integers_of_every_kind_pass_as_python_ints(value) -> None:
    assert is_int(value)
    out = check_int("n", value, minimum=1)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, np.True_, 3.0, np.float32(3), "3", None, [3]])
def test_bools_floats_and_strings_are_not_integers(value) -> None:
    assert not is_int(value)
    with pytest.raises(ValueError, match=r"^n must be a non-negative integer, got "):
        check_int("n", value)


@pytest.mark.parametrize(
    ("minimum", "wording"),
    [(0, "a non-negative integer"), (1, "a positive integer"), (2, "an integer >= 2")],
)
def test_the_message_words_the_minimum(minimum, wording) -> None:
    with pytest.raises(ValueError, match=rf"^size must be {wording}, got -1$"):
        check_int("size", -1, minimum=minimum)


def test_message_hint_and_error_type_can_be_chosen() -> None:
    with pytest.raises(TypeError, match=r"^batches must be an integer >= 1, got 0 \(or skip it\)$"):
        check_int(
            "batches",
            0,
            minimum=1,
            message="batches must be an integer >= 1",
            hint="or skip it",
            error=TypeError,
        )


def test_optional_ints_let_none_through_and_say_so() -> None:
    assert check_optional_int("max_length", None, minimum=1) is None
    assert type(check_optional_int("max_length", np.int32(5), minimum=1)) is int
    with pytest.raises(ValueError, match=r"^max_length must be a positive integer or None, got 0$"):
        check_optional_int("max_length", 0, minimum=1)


def test_bools_numpy_bools_and_nothing_else() -> None:
    assert check_bool("drop_last", np.False_) is False
    with pytest.raises(TypeError, match=r"^drop_last must be True or False, got int: 1$"):
        check_bool("drop_last", 1)


def test_choices_and_seconds() -> None:
    assert check_choice("mode", "pad", ("pad", "drop")) == "pad"
    with pytest.raises(ValueError, match=r"^mode must be one of \('pad', 'drop'\), got 'Pad'$"):
        check_choice("mode", "Pad", ("pad", "drop"))
    assert check_seconds("timeout", np.int64(2)) == 2.0
    with pytest.raises(
        ValueError, match="timeout must be a non-negative number of seconds, got nan"
    ):
        check_seconds("timeout", float("nan"))


@pytest.mark.parametrize(
    ("value", "plain"),
    [(2, 2), (np.int64(2), 2), (0.5, 0.5), (np.float32(0.5), 0.5), (float("inf"), float("inf"))],
)
def test_numbers_of_every_kind_pass_in_their_plain_python_type(value, plain) -> None:
    assert is_number(value)
    out = check_number("num_cpus", value)
    assert out == plain and type(out) is type(plain)


@pytest.mark.parametrize("value", [True, np.False_, float("nan"), np.float64("nan"), "1", None])
def test_bools_nan_and_strings_are_not_numbers(value) -> None:
    assert not is_number(value)
    with pytest.raises(ValueError, match=r"^num_cpus must be a number >= 0, got "):
        check_number("num_cpus", value)


def test_a_number_check_words_its_bound_and_hint() -> None:
    with pytest.raises(ValueError, match=r"^amount must be a number >= 0\.5, got 0\.25$"):
        check_number("amount", 0.25, minimum=0.5)
    with pytest.raises(ValueError, match=r"^amount must be a number > 0, got 0 \(per actor\)$"):
        check_number("amount", 0, above=True, hint="per actor")
    assert check_number("amount", np.float64(1e-9), above=True) == 1e-9
