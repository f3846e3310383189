"""The public surface: a sorted __all__ whose names all exist, and no torch on import."""

from __future__ import annotations

import importlib

import pytest

import stoker

MODULES = [
    "stoker",
    "stoker.bad_samples",
    "stoker.collate",
    "stoker.compact",
    "stoker.datasets",
    "stoker.doctor",
    "stoker.formats",
    "stoker.formats.image_folder",
    "stoker.formats.packed",
    "stoker.formats.tar",
    "stoker.formats.text",
    "stoker.samplers",
    "stoker.seeding",
    "stoker.sharding",
    "stoker.streams",
    "stoker.tuning",
    "stoker.vision",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_complete(name) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"


def test_version_is_exposed() -> None:
    assert stoker.__version__.count(".") == 2


def test_every_public_class_has_a_docstring_with_an_example() -> None:
    lacking = [
        n
        for n in stoker.__all__
        if isinstance(getattr(stoker, n), type)
        and not issubclass(getattr(stoker, n), Exception)
        and "Example" not in (getattr(stoker, n).__doc__ or "")
    ]
    assert not lacking, f"public classes without an Example in their docstring: {lacking}"
