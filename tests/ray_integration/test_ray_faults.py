"""An actor killed and a node lost mid-epoch: named, replaced, their batches re-issued once."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import stoker
from ray_integration.cluster_helpers import node_args, stoker_actors, wait_no_stoker_actors
from ray_integration.ray_datasets import Noisy, StallsAt

ray = pytest.importorskip("ray", reason="Ray workers need ray: pip install 'stoker[ray]'")


def _key(batch: dict) -> tuple:
    return tuple(np.asarray(batch["index"]).tolist()), np.asarray(batch["noise"]).tobytes()


def _expected(dataset) -> list[tuple]:
    return [_key(b) for b in stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=3)]


def _node_of(loader, worker_id: int) -> str:
    """The node id of an actor of the loader's live epoch (what its stats line names)."""
    pool = loader._live_pool() if loader._live_pool is not None else loader._pool
    return pool._actors[worker_id].node_id


def test_a_killed_actor_is_named_replaced_and_its_batches_reissued(cluster) -> None:
    dataset = Noisy(64, delay_s=0.01)
    loader = stoker.DataLoader(
        dataset, batch_size=4, shuffle=True, generator=3, num_workers=2,
        worker_mode=stoker.RayWorkers(resources={"preprocess": 1}), on_worker_death="restart",
    )  # fmt: skip
    it = iter(loader)
    got = [_key(next(it)) for _ in range(3)]
    victim = next(name for name in stoker_actors() if name.endswith("-w0-0"))
    node = _node_of(loader, 0)
    ray.kill(ray.get_actor(victim))
    with pytest.warns(RuntimeWarning) as caught:
        got += [_key(b) for b in it]
    assert got == _expected(dataset)  # every index once, the same batches, in order
    text = next(str(w.message) for w in caught if "Ray actor" in str(w.message))
    assert f"worker 0 (Ray actor {victim}" in text
    assert f"on node {node[:12]} (127.0.0.1" in text
    assert "killed by `ray.kill`" in text or "ray.kill" in text
    held = re.search(r"while holding the batches at indices (.*?); started a replacement", text)
    assert held is not None, text
    assert "re-issued its" in text
    figures = loader.stats()
    assert len(figures.actors) == 3  # the replacement has a line of its own
    assert sum(a.batches for a in figures.actors.values()) == 16


def test_a_killed_actor_without_restart_raises_naming_actor_node_and_batches(cluster) -> None:
    loader = stoker.DataLoader(
        Noisy(400, delay_s=0.01), batch_size=4, num_workers=2, worker_mode="ray"
    )
    it = iter(loader)
    next(it)
    while not _node_of(loader, 1):  # started: it answered, so stoker knows its node
        next(it)
    victim = next(name for name in stoker_actors() if name.endswith("-w1-1"))
    node = _node_of(loader, 1)
    ray.kill(ray.get_actor(victim))
    with pytest.raises(stoker.WorkerError) as caught:
        for _ in it:
            pass
    text = str(caught.value)
    assert text.startswith(f"DataLoader worker 1 (Ray actor {victim}, id ")
    assert f"on node {node[:12]} (127.0.0.1" in text
    assert re.search(r"while holding the batches at indices \[\[\d+", text), text
    assert "Pass on_worker_death='restart'" in text
    assert wait_no_stoker_actors() == []  # the survivor was stopped with the broken epoch


def test_a_lost_node_is_named_and_its_actors_replaced_elsewhere(cluster) -> None:
    doomed = cluster.add_node(**node_args(num_cpus=2, resources={"spare": 2}))
    refuge = None
    try:
        dataset = Noisy(96, delay_s=0.01)
        loader = stoker.DataLoader(
            dataset, batch_size=4, shuffle=True, generator=3, num_workers=2,
            worker_mode=stoker.RayWorkers(num_cpus=0.5, resources={"spare": 1}),
            on_worker_death="restart",
        )  # fmt: skip
        it = iter(loader)
        got = [_key(next(it)) for _ in range(3)]
        assert _node_of(loader, 0) == _node_of(loader, 1) == doomed.node_id  # both on it
        refuge = cluster.add_node(**node_args(num_cpus=2, resources={"spare": 2}))
        cluster.remove_node(doomed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got += [_key(b) for b in it]
        assert got == _expected(dataset)  # nothing lost, nothing twice
        texts = [str(w.message) for w in caught if "Ray actor" in str(w.message)]
        assert len(texts) == 2, texts  # one per actor
        for text in texts:
            assert f"on node {doomed.node_id[:12]} (127.0.0.1" in text
            assert "was lost with its node, which left the cluster" in text
            assert "re-issued its" in text
        figures = loader.stats()
        assert refuge.node_id[:12] in " ".join(figures.nodes)  # the replacements ran there
    finally:
        if refuge is not None:
            cluster.remove_node(refuge)
        if doomed in cluster.worker_nodes:
            cluster.remove_node(doomed)


def test_a_stuck_actor_times_out_with_its_stack(cluster) -> None:
    # the timeout covers each next(), the first one's actor start included: 5 s leaves a
    # busy machine time to start two actors
    loader = stoker.DataLoader(
        StallsAt(16, slow=6), batch_size=4, num_workers=2, worker_mode="ray", timeout=5
    )
    it = iter(loader)
    assert np.asarray(next(it)["index"]).tolist() == [0, 1, 2, 3]
    with pytest.raises(stoker.WorkerError) as caught:
        next(it)
    text = str(caught.value)
    assert "timed out after 5 seconds waiting for the batch at indices [4, 5, 6, 7]" in text
    assert "from worker 1 (pid " in text
    # the stack of the actor's loop thread, asked of the actor while the sample sleeps
    assert "Ray actor stoker-" in text
    assert "in __getitem__" in text and "time.sleep(60)" in text
    assert wait_no_stoker_actors() == []
