"""A Ray cluster of three nodes on this machine, every address on 127.0.0.1, and its leak check.

``cluster`` starts it once for this folder (package scope: it is gone before the tests of
other folders run, so their leak checks never meet Ray's processes):

* the head node, where this process is the driver (the trainer): 1 CPU, ``{"trainer": 1}``;
* two loading nodes: 2 CPUs and ``{"preprocess": 2}`` each.

Tests that lose a node add nodes of their own and remove them.

Ray picks a machine's address by asking the kernel which interface reaches the outside;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes it use the loopback address instead, and
every node is started with ``node_ip_address="127.0.0.1"``. ``test_ray_cluster.py``
checks that no Ray process listens on or talks to any other address.

The leak check here replaces the folder-wide one of ``tests/conftest.py`` for these
tests, and is no weaker about stoker's own leftovers: after each test, no stoker actor is
alive in the cluster, this process holds no more object references than before the test,
and no new process, thread, pipe, segment or stack file is left, except for Ray's own
processes that are not stoker actors (Ray keeps idle worker processes and starts
new ones when it likes) and the sockets of Ray's connections.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stoker
from harness import leaks
from ray_integration.cluster_helpers import (
    SYSTEM_CONFIG,
    node_args,
    owned_references,
    ray_pool_process,
    wait_no_stoker_actors,
)
from stoker import _proc


@pytest.fixture(scope="package")
def cluster() -> Iterator[Any]:
    """The three-node cluster, with this process connected to it as the driver."""
    ray = pytest.importorskip("ray", reason="Ray workers need ray: pip install 'stoker[ray]'")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "PYTHONPATH")}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by Ray's processes at start
    ray_constants.ENABLE_RAY_CLUSTER = False  # and by this one, which imported Ray already
    # the actors import this stoker and the test datasets (tests/ is on pytest's path only)
    src = str(Path(stoker.__file__).parent.parent)
    tests = str(Path(__file__).parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, tests, saved["PYTHONPATH"]]))
    if ray.is_initialized():
        ray.shutdown()
    made = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args=node_args(
            num_cpus=1,
            resources={"trainer": 1},
            include_dashboard=False,
            _system_config=SYSTEM_CONFIG,
        ),
    )
    try:
        for _ in range(2):
            made.add_node(**node_args(num_cpus=2, resources={"preprocess": 2}))
        made.wait_for_nodes()
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """The leak check of tests/conftest.py, plus: no stoker actor, no object reference left."""
    connected = "cluster" in request.fixturenames
    refs_before = owned_references() if connected else set()
    before = leaks.baseline()
    yield
    gc.collect()
    problems: list[str] = []
    if connected:
        problems += [f"stoker actor {name} is alive" for name in wait_no_stoker_actors()]
        problems += [f"object reference {ref} is held" for ref in owned_references() - refs_before]
    me = os.getpid()
    allowed = leaks.Baseline(
        processes=before.processes
        | {(p.pid, p.start_ticks) for p in leaks.descendants(me) if ray_pool_process(p.pid)},
        threads=before.threads,
        segments=before.segments,
        stacks=before.stacks,
        fds=before.fds
        | {(fd, what) for fd, what in _proc.open_fds().items() if what.startswith("socket:")},
    )
    problems += leaks.leftovers(allowed)
    if problems:
        pytest.fail("the test left things behind:\n  " + "\n  ".join(problems), pytrace=False)
