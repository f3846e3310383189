"""Both kinds of pool provide every member of stoker.engine.pool.Pool, which is what the
epoch's iterator and the loader use of a pool: a member one of them lacks, or a method
whose parameters differ, fails here rather than mid-epoch with Ray workers."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.engine import multi_worker
from stoker.engine.pool import Pool, WorkerPool
from stoker.engine.ray_workers import RayPool

POOLS = [WorkerPool, RayPool]


def _protocol_members() -> dict[str, object]:
    """Pool's members: its annotated attributes (None) and its methods and properties."""
    members: dict[str, object] = dict.fromkeys(Pool.__annotations__)
    for name, value in vars(Pool).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            members[name] = value
    return members


def _assigned_on_self(cls: type) -> set[str]:
    """The attributes a class's methods assign on ``self`` (instance attributes)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == "self"
                ):
                    names.add(part.attr)
    return names


def _pool_accesses(path: Path) -> set[str]:
    """The members read of ``pool`` / ``self._pool`` in a source file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "pool") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "_pool"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            names.add(node.attr)
    return names


def test_the_protocol_names_the_members_pools_are_expected_to_have() -> None:
    members = _protocol_members()
    for name in ("poll", "send", "shutdown", "slots", "ledger", "memory_watch", "state"):
        assert name in members, f"Pool lacks {name}"


@pytest.mark.parametrize("cls", POOLS, ids=lambda cls: cls.__name__)
def test_each_pool_class_provides_every_protocol_member(cls: type) -> None:
    provided = set(dir(cls)) | _assigned_on_self(cls)
    missing = sorted(set(_protocol_members()) - provided)
    assert not missing, f"{cls.__name__} lacks Pool's {', '.join(missing)}"


@pytest.mark.parametrize("cls", POOLS, ids=lambda cls: cls.__name__)
def test_each_pool_class_takes_the_protocols_parameters(cls: type) -> None:
    for name, member in _protocol_members().items():
        if not inspect.isfunction(member):
            continue
        wanted = list(inspect.signature(member).parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert got == wanted, f"{cls.__name__}.{name}{got} differs from Pool.{name}{wanted}"


def test_the_protocol_is_exactly_what_the_iterator_and_the_loader_use() -> None:
    used = _pool_accesses(Path(multi_worker.__file__))
    used |= _pool_accesses(Path(stoker.__file__).parent / "loader.py")
    assert used == set(_protocol_members())


def test_a_loaders_running_pool_is_a_pool() -> None:
    loader = stoker.DataLoader(
        stoker.ArrayDataset(np.arange(8)),
        batch_size=2,
        num_workers=1,
        worker_mode="thread",
        persistent_workers=True,
    )
    try:
        assert next(iter(loader))[0].tolist() == [0, 1]
        assert isinstance(loader._pool, WorkerPool) and isinstance(loader._pool, Pool)
    finally:
        loader.close()
    assert not isinstance(object(), Pool)
