"""The exception tree: drawn in stoker._errors, exported from stoker, named there in tracebacks."""

from __future__ import annotations

import pickle
import re
import traceback

import pytest

import stoker
from stoker import _errors
from stoker.collate import default_collate

ERRORS = [getattr(_errors, name) for name in _errors.__all__]


def _drawn_tree() -> dict[str, list[str]]:
    """``{class name: [base names]}`` as the module docstring draws them."""
    found = re.findall(r"[├└]── (\w+) \(([\w, ]+)\)", _errors.__doc__ or "")
    return {name: [b.strip() for b in bases.split(",")] for name, bases in found}


def test_the_drawn_tree_has_every_exception_with_its_true_bases() -> None:
    drawn = _drawn_tree()
    assert sorted(drawn) == sorted(n for n in _errors.__all__ if n != "StokerError")
    for cls in ERRORS:
        if cls is not stoker.StokerError:
            assert drawn[cls.__name__] == [b.__name__ for b in cls.__bases__], cls


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_exception_is_exported_from_stoker_and_named_there(cls) -> None:
    assert cls.__name__ in stoker.__all__
    assert getattr(stoker, cls.__name__) is cls
    assert cls.__module__ == "stoker"
    assert issubclass(cls, stoker.StokerError)
    again = pickle.loads(pickle.dumps(cls("message")))  # how a worker's error travels
    assert type(again) is cls and str(again) == "message"


def test_the_old_import_paths_give_the_same_classes() -> None:
    from stoker.bad_samples import TooManyBadSamples
    from stoker.formats.packed import PackedFormatError
    from stoker.vision import ImageDecodeError
    from stoker.vision.decode import ImageDecodeError as FromDecode

    assert TooManyBadSamples is stoker.TooManyBadSamples
    assert PackedFormatError is stoker.PackedFormatError
    assert ImageDecodeError is FromDecode is stoker.ImageDecodeError


def test_a_traceback_names_the_public_class() -> None:
    with pytest.raises(stoker.CollateError) as info:
        default_collate([None, None])
    text = "".join(traceback.format_exception(info.value))
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("stoker.CollateError: cannot collate the samples (batch of 2)"), last
    assert "stoker._errors" not in text
    assert repr(stoker.DatasetIndexError("index 3")) == "DatasetIndexError('index 3')"
