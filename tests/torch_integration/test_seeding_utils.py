"""seed_everything: one call seeds random, numpy, torch and cuDNN's choices."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from stoker.seeding import seed_everything


@pytest.fixture(autouse=True)
def restore_globals(monkeypatch):
    """seed_everything changes process-wide state; put it back after each test."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    torch = sys.modules.get("torch")
    if torch is not None:
        monkeypatch.setattr(
            torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic
        )
        monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)


def draws() -> tuple:
    torch = sys.modules.get("torch")
    return (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(())) if torch is not None else None,
    )


def test_the_same_seed_gives_the_same_draws_everywhere() -> None:
    pytest.importorskip("torch", reason="checks that torch's generator is seeded too")
    assert seed_everything(1234) == 1234
    first = draws()
    seed_everything(1234)
    assert draws() == first
    seed_everything(1235)
    other = draws()
    assert all(a != b for a, b in zip(first, other, strict=True)), "each generator follows the seed"


def test_cudnn_is_made_deterministic_unless_asked_not_to() -> None:
    torch = pytest.importorskip("torch", reason="the cuDNN flags live in torch")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    seed_everything(0, deterministic_cudnn=False)
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (False, True)
    seed_everything(0)
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (True, False)


def test_child_processes_get_the_hash_seed() -> None:
    seed_everything(99)
    assert os.environ["PYTHONHASHSEED"] == "99"
    hashes = {
        subprocess.run(
            [sys.executable, "-c", "print(hash('stoker'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(2)
    }
    assert len(hashes) == 1, "children hash strings the same way"


def test_works_without_torch(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    assert seed_everything(5) == 5
    first = (random.random(), float(np.random.rand()))
    seed_everything(5)
    assert (random.random(), float(np.random.rand())) == first


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (True, TypeError, r"seed must be an int in \[0, 4294967295\], got bool: True"),
        (1.5, TypeError, r"seed must be an int in \[0, 4294967295\], got float: 1.5"),
        (-1, ValueError, r"seed must be in \[0, 4294967295\] .* got -1; reduce it"),
        (2**32, ValueError, r"got 4294967296; reduce it, for example with seed % 2\*\*32"),
    ],
)
def test_invalid_seeds_say_what_to_pass(seed, error, message) -> None:
    with pytest.raises(error, match=message):
        seed_everything(seed)


def test_deterministic_cudnn_must_be_a_bool() -> None:
    with pytest.raises(
        TypeError, match=r"deterministic_cudnn must be True or False, got str: 'yes'"
    ):
        seed_everything(1, deterministic_cudnn="yes")


def test_numpy_integer_seeds_are_accepted() -> None:
    assert seed_everything(np.int64(8)) == 8
    assert type(seed_everything(np.uint32(8))) is int
