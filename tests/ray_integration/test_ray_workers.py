"""Ray actors as workers: the same batches as num_workers=0, exact resume, errors, stats, close."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import stoker
from ray_integration.cluster_helpers import stoker_actors, wait_no_stoker_actors
from ray_integration.ray_datasets import (
    BrokenSample,
    Counting,
    FailsAt,
    Noisy,
    StallsAt,
    failing_init,
)

ray = pytest.importorskip("ray", reason="Ray workers need ray: pip install 'stoker[ray]'")

ON_LOADING_NODES = stoker.RayWorkers(resources={"preprocess": 1})


def _key(batch: dict) -> tuple:
    """A batch as comparable values: its indices and the bytes of every array."""
    return (
        tuple(np.asarray(batch["index"]).tolist()),
        np.asarray(batch["noise"]).tobytes(),
        np.asarray(batch["image"]).tobytes() if "image" in batch else b"",
    )


def _loader(dataset, **kwargs) -> stoker.DataLoader:
    options = {"batch_size": 4, "shuffle": True, "generator": 7, **kwargs}
    return stoker.DataLoader(dataset, **options)


def test_batches_equal_those_of_num_workers_0_in_order(cluster) -> None:
    dataset = Noisy(48)
    expected = [_key(b) for b in _loader(dataset)]
    loader = _loader(dataset, num_workers=3, worker_mode=ON_LOADING_NODES)
    got = [_key(b) for b in loader]
    assert got == expected  # same order, same random draws, whichever actor loaded a sample
    figures = loader.stats()
    assert sum(a.batches for a in figures.actors.values()) == len(expected)
    assert len(figures.actors) == 3


def test_out_of_order_delivers_every_index_once_with_the_same_batches(cluster) -> None:
    dataset = Noisy(40, delay_s=0.002)
    expected = sorted(_key(b) for b in _loader(dataset))
    loader = _loader(dataset, num_workers=2, worker_mode=ON_LOADING_NODES, in_order=False)
    got = [_key(b) for b in loader]
    assert sorted(got) == expected
    indices = [i for key in got for i in key[0]]
    assert sorted(indices) == list(range(40))


def test_batches_are_views_of_the_object_store_or_writable_copies(cluster) -> None:
    dataset = Noisy(8, side=128)  # 64 KiB per image: Ray's object store carries the batch
    copies = stoker.RayWorkers(zero_copy=False)
    copied = next(iter(_loader(dataset, num_workers=1, worker_mode=copies)))
    assert copied["image"].flags.writeable
    loaded = copied["image"].copy()
    copied["image"] += 1  # a user may normalise in place, as with process workers
    view = next(iter(_loader(dataset, num_workers=1, worker_mode="ray")))  # zero_copy=True
    assert not view["image"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view["image"] += 1  # a view of the store fails loudly, never writes into it
    np.testing.assert_array_equal(view["image"], loaded)
    del view
    gc.collect()


def test_state_dict_resumes_exactly_across_process_workers_and_ray_actors(cluster) -> None:
    dataset = Noisy(40)
    expected = [_key(b) for b in _loader(dataset)]
    # saved by process workers mid-epoch, resumed by Ray actors
    process_loader = _loader(dataset, num_workers=2)
    it = iter(process_loader)
    first = [_key(next(it)) for _ in range(3)]
    state = process_loader.state_dict()
    del it
    ray_loader = _loader(dataset, num_workers=2, worker_mode=ON_LOADING_NODES)
    ray_loader.load_state_dict(state)
    it = iter(ray_loader)
    middle = [_key(next(it)) for _ in range(4)]
    # saved by Ray actors mid-epoch, resumed by process workers
    state = ray_loader.state_dict()
    del it
    back = _loader(dataset, num_workers=2)
    back.load_state_dict(state)
    rest = [_key(b) for b in back]
    assert first + middle + rest == expected


def test_iterable_dataset_is_sharded_over_actors_and_persistent_actors_serve_two_epochs(
    cluster,
) -> None:
    loader = stoker.DataLoader(
        Counting(30), batch_size=5, num_workers=2, persistent_workers=True,
        worker_mode=ON_LOADING_NODES,
    )  # fmt: skip
    for _epoch in range(2):
        names = None
        indices = []
        for batch in loader:
            indices += np.asarray(batch["index"]).tolist()
            names = names or stoker_actors()
        assert sorted(indices) == list(range(30))  # each index once: the actors shard the stream
        assert len(names) == 2
    assert stoker_actors() == names  # persistent: the same actors, between epochs too
    loader.close()
    assert wait_no_stoker_actors() == []


@pytest.mark.parametrize("stream", ["StatefulIterator", "Stateless"])
def test_a_stream_read_by_actors_resumes_where_the_loop_stopped(cluster, stream) -> None:
    from harness import streams

    def make():
        return stoker.DataLoader(
            getattr(streams, stream)(40), batch_size=4, collate_fn=list, generator=2,
            num_workers=2, worker_mode=ON_LOADING_NODES,
        )  # fmt: skip

    whole, head, rest, state = streams.round_trip(make, 3)
    assert set(state["workers"]["streams"]) == {0, 1}  # each actor was asked for its state
    assert head + rest == whole
    assert wait_no_stoker_actors() == []


def test_a_dataset_error_arrives_with_its_type_index_actor_and_traceback(cluster) -> None:
    loader = stoker.DataLoader(FailsAt(16, bad=5), batch_size=4, num_workers=2, worker_mode="ray")
    it = iter(loader)
    assert np.asarray(next(it)["index"]).tolist() == [0, 1, 2, 3]
    with pytest.raises(BrokenSample, match="sample 5 is corrupt") as caught:
        next(it)
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "Raised in stoker worker 1" in note
    assert "while loading indices [4, 5, 6, 7]" in note
    assert "ray_datasets.py" in note and "raise BrokenSample" in note  # the actor's traceback
    # the iterator goes on with the next batch, as with process workers
    assert np.asarray(next(it)["index"]).tolist() == [8, 9, 10, 11]
    del it


def test_close_and_an_abandoned_iterator_leave_no_actor_behind(cluster) -> None:
    loader = _loader(Noisy(400), num_workers=2, worker_mode=ON_LOADING_NODES)
    it = iter(loader)
    next(it)
    assert len(stoker_actors()) == 2
    del it  # abandoned mid-epoch, with batches in flight
    gc.collect()
    assert wait_no_stoker_actors() == []
    persistent = _loader(Noisy(400), num_workers=2, worker_mode="ray", persistent_workers=True)
    it = iter(persistent)
    next(it)
    persistent.close()
    assert wait_no_stoker_actors() == []
    with pytest.raises(StopIteration):
        next(it)


def test_actors_go_where_their_resources_are_and_stats_show_each_node(cluster) -> None:
    loader = _loader(Noisy(64, side=64), num_workers=4, worker_mode=ON_LOADING_NODES)
    assert len(list(loader)) == 16
    figures = loader.stats()
    head = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("trainer"))
    nodes = figures.nodes
    # four actors asking for {"preprocess": 1}: two on each loading node, none on the head
    assert sorted(n.actors for n in nodes.values()) == [2, 2]
    assert not any(head[:12] in name for name in nodes)
    assert sum(n.batches for n in nodes.values()) == 16
    assert all(n.bytes >= n.batches * 4 * 64 * 64 * 4 for n in nodes.values())
    assert all(n.transfer_s > 0 and n.busy_s > 0 for n in nodes.values())
    text = str(figures)
    assert text.count("2 actor(s): ") == 2
    assert "transfer " in text and "MiB/s" in text


def test_an_actor_that_cannot_be_placed_is_named_with_the_request(cluster) -> None:
    options = stoker.RayWorkers(resources={"gpu_free_node": 1}, start_timeout_s=1.5)
    loader = _loader(Noisy(8), num_workers=1, worker_mode=options)
    with pytest.raises(stoker.WorkerError) as caught:
        next(iter(loader))
    text = str(caught.value)
    assert "was not placed and started within 1.5 s" in text
    assert "1 CPU and {'gpu_free_node': 1}" in text
    assert "'preprocess': " in text  # what the cluster does have free
    assert wait_no_stoker_actors() == []


_TRAINER = """
import os, signal, sys, stoker
from ray_integration.ray_datasets import Noisy
# stoker connects this process to the cluster (RayWorkers(address=...))
workers = stoker.RayWorkers(
    address=sys.argv[1],
    init_options={"_node_ip_address": "127.0.0.1", "log_to_driver": False},
)
loader = stoker.DataLoader(
    Noisy(400, delay_s=0.01), batch_size=4, num_workers=2, worker_mode=workers,
    persistent_workers=True,
)
it = iter(loader)
next(it)
print(" ".join(loader._pool.actor_names()), flush=True)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exits", "killed"])
def test_a_trainer_that_ends_without_close_leaves_no_actor(cluster, end) -> None:
    env = dict(os.environ)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    src = str(Path(stoker.__file__).parent.parent)
    tests = str(Path(__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, tests, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _TRAINER, cluster.address, end],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    names = result.stdout.split()
    assert len(names) == 2 and all(n.startswith("stoker-") for n in names), result.stderr[-2000:]
    assert result.returncode == (-signal.SIGKILL if end == "killed" else 0)
    # at exit the loader's finalizer kills its actors; a killed trainer's actors go with its job
    assert wait_no_stoker_actors() == []


def test_a_failing_worker_init_fn_is_reported_with_its_worker(cluster) -> None:
    loader = stoker.DataLoader(
        Noisy(16), batch_size=4, num_workers=2, worker_mode="ray", worker_init_fn=failing_init
    )
    with pytest.raises(RuntimeError, match="worker 1 cannot open its database") as caught:
        list(loader)
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "Raised in stoker worker 1" in note
    assert "in worker_init_fn or while starting the worker" in note
    assert "failing_init" in note  # the actor's traceback
    assert wait_no_stoker_actors() == []


def test_auto_grows_actors_up_to_what_the_cluster_holds(cluster) -> None:
    dataset = Noisy(64, delay_s=0.003)
    expected = [_key(b) for b in _loader(dataset)]
    loader = _loader(dataset, num_workers="auto", worker_mode=ON_LOADING_NODES)
    assert [_key(b) for b in loader] == expected
    # the ceiling is the cluster's, not this machine's: two nodes with {"preprocess": 2}
    assert loader._autotuner.max_workers == 4


def test_stoker_torch_gets_tensors_from_actors(cluster) -> None:
    torch = pytest.importorskip("torch", reason="stoker.torch needs torch")
    from stoker.torch import DataLoader as TorchLoader

    dataset = Noisy(24, side=64)  # 16 KiB images: the batches lie in Ray's object store
    options = {"batch_size": 4, "shuffle": True, "generator": torch.Generator().manual_seed(5)}
    expected = list(TorchLoader(dataset, **options))
    options["generator"] = torch.Generator().manual_seed(5)
    # read-only views of the store become tensors without torch's non-writable warning
    # (warnings are errors in this suite): stoker.torch copies them
    got = list(TorchLoader(dataset, num_workers=2, worker_mode=ON_LOADING_NODES, **options))
    assert len(got) == len(expected) == 6
    for mine, theirs in zip(got, expected, strict=True):
        assert isinstance(mine["image"], torch.Tensor)
        assert torch.equal(mine["image"], theirs["image"])
        assert torch.equal(mine["index"], theirs["index"])


@pytest.mark.parametrize("closer", ["iterator", "loader"])
def test_close_from_another_thread_ends_a_next_waiting_on_actors(cluster, closer) -> None:
    """next() waits on an actor stuck in a slow sample; another thread closes: next()
    raises StopIteration within seconds and no actor is left (it stayed blocked)."""
    loader = _loader(
        StallsAt(40, slow=8), num_workers=2, worker_mode="ray", shuffle=False, prefetch_factor=1
    )
    it = iter(loader)
    assert [next(it)["index"].tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    timer = threading.Timer(0.5, (it if closer == "iterator" else loader).close)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(StopIteration):
            next(it)
    finally:
        timer.join()
    waited = time.monotonic() - started
    assert waited < 10.0, f"next() took {waited:.1f} s to notice the close"
    assert list(it) == []
    assert wait_no_stoker_actors() == []
