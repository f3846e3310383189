"""mix(): exact proportions over windows, exhaustion policies, determinism, workers, resume."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from stoker import (
    DataLoader,
    IterableDataset,
    Mix,
    RandomSampler,
    ShuffleBuffer,
    WeightedRandomSampler,
    mix,
)
from stoker.formats.text import JsonLines
from stoker.streams.mixing import _Schedule


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


class Tagged(IterableDataset):
    """``(tag, i)`` for i in range(n): an iterable source without a state."""

    def __init__(self, tag: str, n: int) -> None:
        self.tag, self.n = tag, n

    def __iter__(self):
        return ((self.tag, i) for i in range(self.n))


def write_source(folder, tag: str, n: int, files: int = 3) -> str:
    os.makedirs(folder / tag)
    for k in range(files):
        with open(folder / tag / f"part-{k}.jsonl", "w") as f:
            for i in range(k, n, files):
                f.write(json.dumps([tag, i]) + "\n")
    return str(folder / tag)


def window_errors(picks: np.ndarray, shares, widths) -> float:
    worst = 0.0
    for i, share in enumerate(shares):
        counts = np.concatenate([[0], np.cumsum(picks == i)])
        for w in widths:
            window = counts[w:] - counts[:-w]
            worst = max(worst, float(np.abs(window - w * share).max()))
    return worst


@pytest.mark.parametrize("k", [2, 3, 5])
def test_every_prefix_within_1_and_every_window_within_2_or_1_for_two_sources(k) -> None:
    rng = np.random.default_rng(k)
    for _ in range(40):
        weights = rng.random(k) + 0.01
        shares = weights / weights.sum()
        schedule = _Schedule(weights, rng.permutation(k).tolist())
        picks = np.array([schedule.next() for _ in range(500)])
        prefix = 0.0
        for i, share in enumerate(shares):
            counts = np.cumsum(picks == i)
            prefix = max(prefix, float(np.abs(counts - np.arange(1, 501) * share).max()))
        assert prefix < 1
        bound = 1 if k == 2 else 2
        assert window_errors(picks, shares, [1, 2, 3, 5, 10, 33, 100]) < bound


def test_mixed_output_follows_the_weights_in_every_window() -> None:
    mixed = list(mix([Tagged("a", 700), Tagged("b", 300)], [0.7, 0.3]))
    assert len(mixed) >= 998  # stops when a source first runs dry
    picks = np.array([0 if tag == "a" else 1 for tag, _ in mixed])
    assert window_errors(picks, [0.7, 0.3], [10, 20, 50, 100]) < 1
    assert [i for tag, i in mixed if tag == "a"] == list(range((picks == 0).sum()))  # in order


def test_stop_ends_the_mix_at_the_first_exhausted_source() -> None:
    mixed = list(mix([Tagged("a", 100), Tagged("b", 5)], [0.5, 0.5]))
    assert sum(tag == "b" for tag, _ in mixed) == 5
    assert sum(tag == "a" for tag, _ in mixed) in (5, 6)


def test_restart_oversamples_until_every_source_ran_out_once() -> None:
    mixed = list(mix([Tagged("a", 100), Tagged("b", 5)], [0.5, 0.5], on_exhausted="restart"))
    a = [i for tag, i in mixed if tag == "a"]
    b = [i for tag, i in mixed if tag == "b"]
    assert a == list(range(100))
    assert b == [i % 5 for i in range(len(b))] and len(b) in (99, 100, 101)


def test_drop_reads_every_source_to_its_end_and_renormalises() -> None:
    mixed = list(
        mix([Tagged("a", 50), Tagged("b", 5), Tagged("c", 40)], [1, 1, 2], on_exhausted="drop")
    )
    assert sorted(mixed) == sorted(
        [("a", i) for i in range(50)] + [("b", i) for i in range(5)] + [("c", i) for i in range(40)]
    )
    first = mixed[:20]
    assert sum(t == "c" for t, _ in first) == 10  # weights 1:1:2 while all three last


def test_map_style_sources_in_order_or_by_their_sampler() -> None:
    plain = list(mix([list("abcd"), list("wxyz")]))
    assert plain == list("awbxcydz")
    sampler = RandomSampler(range(4), generator=3)
    shuffled = list(mix([(list("abcd"), sampler), list("wxyz")]))
    assert sorted(shuffled[::2]) == list("abcd") and shuffled[1::2] == list("wxyz")
    assert shuffled[::2] == [list("abcd")[i] for i in RandomSampler(range(4), generator=3)]


def test_the_seed_breaks_ties_per_epoch_and_keeps_the_schedule() -> None:
    def tags(m):
        return "".join(t for t, _ in m)

    same = [tags(mix([Tagged("a", 20), Tagged("b", 20)], seed=4)) for _ in range(2)]
    assert same[0] == same[1]
    orders = set()
    for epoch in range(8):
        m = mix([Tagged("a", 20), Tagged("b", 20)], seed=4)
        m.set_epoch(epoch)
        order = tags(m)
        assert order in ("ab" * 20, "ba" * 20)
        orders.add(order)
    assert len(orders) == 2


def make_mix(tmp_path, policy="stop"):
    a = JsonLines(os.path.join(tmp_path, "a"), shuffle_buffer=8)
    b = ShuffleBuffer(JsonLines(os.path.join(tmp_path, "b")), 4)
    c = [("c", i) for i in range(30)]
    return mix([a, b, c], [0.5, 0.3, 0.2], on_exhausted=policy)


@pytest.mark.parametrize("policy", ["stop", "restart", "drop"])
@pytest.mark.parametrize("stop", [0, 1, 9, 37, 80])
def test_resuming_a_mix_equals_the_uninterrupted_run(tmp_path, policy, stop) -> None:
    write_source(tmp_path, "a", 70)
    write_source(tmp_path, "b", 25)

    def items(loader):
        return [tuple(x) for x in loader]

    whole = items(DataLoader(make_mix(tmp_path, policy), batch_size=None, generator=3))
    loader = DataLoader(make_mix(tmp_path, policy), batch_size=None, generator=3)
    iterator = iter(loader)
    head = [tuple(x) for _, x in zip(range(stop), iterator, strict=False)]
    state = loader.state_dict() if len(head) < len(whole) else None
    del iterator
    if state is None:
        return
    resumed = DataLoader(make_mix(tmp_path, policy), batch_size=None, generator=8)
    resumed.load_state_dict(state)
    assert head + items(resumed) == whole


def test_with_two_process_workers_each_worker_mixes_its_shard(tmp_path) -> None:
    write_source(tmp_path, "a", 60, files=4)
    write_source(tmp_path, "b", 30, files=4)
    mixed = mix(
        [JsonLines(tmp_path / "a"), JsonLines(tmp_path / "b"), [["c", i] for i in range(20)]],
        [3, 2, 1],
        on_exhausted="drop",
    )
    got = [tuple(x) for x in DataLoader(mixed, batch_size=None, num_workers=2)]
    want = (
        [("a", i) for i in range(60)]
        + [("b", i) for i in range(30)]
        + [("c", i) for i in range(20)]
    )
    assert sorted(got) == sorted(want)
    head = [t for t, _ in got[:60]]  # 30 draws of each worker: 3:2:1 exactly
    assert head.count("a") == 30 and head.count("b") == 20 and head.count("c") == 10


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(2, 2), (1, 0)], ids=["2", "1-to-0"])
@pytest.mark.parametrize("policy", ["stop", "drop"])
@pytest.mark.parametrize("stop", [1, 4, 9])
def test_resuming_a_mix_read_by_process_workers_equals_the_uninterrupted_run(
    tmp_path, policy, stop, saved_with, resumed_with
) -> None:
    write_source(tmp_path, "a", 70, files=4)
    write_source(tmp_path, "b", 25, files=4)

    def loader(num_workers):
        return DataLoader(
            make_mix(tmp_path, policy),
            batch_size=4,
            collate_fn=list,
            num_workers=num_workers,
            generator=3,
        )

    def items(batches):
        return [tuple(x) for batch in batches for x in batch]

    whole = items(loader(saved_with))
    first = loader(saved_with)
    iterator = iter(first)
    head = items(next(iterator) for _ in range(stop))
    state = first.state_dict()
    first.close()
    assert state["workers"]["num_workers"] == saved_with
    assert {s["dataset"]["kind"] for s in state["workers"]["streams"].values()} == {"stoker.mix"}
    resumed = loader(resumed_with)
    resumed.load_state_dict(state)
    rest = items(resumed)
    resumed.close()
    assert len(rest) == len(whole) - len(head)
    assert head + rest == whole  # the same samples in the same order


def ranked_mix(tmp_path, rank: int | None = None) -> Mix:
    """Three sources, 3:2:1; the readers take ``rank`` (and the mix follows them)."""
    topology = {} if rank is None else {"rank": rank, "world_size": 2}
    return mix(
        [
            JsonLines(tmp_path / "a", **topology),
            JsonLines(tmp_path / "b", **topology),
            [["c", i] for i in range(20)],
        ],
        [3, 2, 1],
        on_exhausted="drop",
    )


def prefix_error(tags: list[str], shares: dict[str, float]) -> float:
    worst = 0.0
    for tag, share in shares.items():
        counts = np.cumsum([t == tag for t in tags])
        worst = max(worst, float(np.abs(counts - np.arange(1, len(tags) + 1) * share).max()))
    return worst


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("given", ["environment", "arguments"])
def test_under_two_ranks_every_sample_once_and_each_shard_in_proportion(
    tmp_path, monkeypatch, num_workers, given
) -> None:
    write_source(tmp_path, "a", 60, files=4)
    write_source(tmp_path, "b", 30, files=4)
    outputs = []
    for rank in (0, 1):
        if given == "environment":
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            mixed = ranked_mix(tmp_path)
        else:
            mixed = ranked_mix(tmp_path, rank)
            assert (mixed.rank, mixed.world_size) == (rank, 2)
        loader = DataLoader(mixed, batch_size=None, num_workers=num_workers)
        outputs.append([tuple(x) for x in loader])
    everything = outputs[0] + outputs[1]
    want = (
        [("a", i) for i in range(60)]
        + [("b", i) for i in range(30)]
        + [("c", i) for i in range(20)]
    )
    assert sorted(everything) == sorted(want)  # every sample exactly once across ranks
    shares = {"a": 0.5, "b": 1 / 3, "c": 1 / 6}
    for got in outputs:
        # each shard (rank x worker) mixes its own part; the loader takes one item per
        # worker in turn, so shard k's draws are got[k::num_workers] until one runs out
        shards = [got] if num_workers == 0 else [got[k::num_workers] for k in range(num_workers)]
        for draws in shards:
            first = [t for t, _ in draws[:18]]  # before any source of the shard runs out
            assert prefix_error(first, shares) < 1


def test_sources_given_different_ranks_are_refused(tmp_path) -> None:
    write_source(tmp_path, "a", 6)
    with pytest.raises(ValueError) as info:
        mix(
            [
                JsonLines(tmp_path / "a", rank=0, world_size=2),
                JsonLines(tmp_path / "a", rank=1, world_size=2),
            ]
        )
    assert str(info.value) == (
        "the sources of mix were given different ranks (rank=0 of world_size=2, rank=1 of "
        "world_size=2); give them one rank"
    )
    with pytest.raises(ValueError, match="pass both rank and world_size to mix"):
        mix([[1, 2]], rank=1)
    mixed = mix([JsonLines(tmp_path / "a", rank=0, world_size=2), [1, 2]])
    assert (mixed.rank, mixed.world_size) == (0, 2)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="one positive, finite number per dataset"):
        mix([Tagged("a", 1), Tagged("b", 1)], [1])
    with pytest.raises(ValueError, match="on_exhausted"):
        mix([Tagged("a", 1)], on_exhausted="never")
    with pytest.raises(ValueError, match="at least one"):
        Mix([])
    with pytest.raises(TypeError, match="state_dict"):
        m = mix([Tagged("a", 3)])
        next(iter(m))
        m.state_dict()


# -- samplers read by several workers --------------------------------------------------------


def torch_random_sampler(data):
    torch = pytest.importorskip("torch", reason="the mix is given torch's own RandomSampler")
    return torch.utils.data.RandomSampler(data)


SAMPLERS = {
    "RandomSampler": RandomSampler,
    "WeightedRandomSampler": lambda data: WeightedRandomSampler(
        np.linspace(1.0, 2.0, len(data)), len(data), replacement=False
    ),
    "torch-RandomSampler": pytest.param(torch_random_sampler, marks=pytest.mark.torch),
}
TOPOLOGIES = [
    (0, "process"),
    (1, "process"),
    (2, "process"),
    (3, "process"),
    (1, "thread"),
    (3, "thread"),
]


def sampled_mix(make_sampler) -> Mix:
    a = [("a", i) for i in range(40)]
    b = [("b", i) for i in range(40)]
    return mix([(a, make_sampler(a)), (b, make_sampler(b))], on_exhausted="drop")


def read_mix(mixed: Mix, num_workers: int, worker_mode: str, seed: int) -> list[tuple[str, int]]:
    loader = DataLoader(
        mixed, batch_size=None, num_workers=num_workers, worker_mode=worker_mode, generator=seed
    )
    return [tuple(x) for x in loader]


@pytest.mark.parametrize("make_sampler", list(SAMPLERS.values()), ids=list(SAMPLERS))
@pytest.mark.parametrize(("num_workers", "worker_mode"), TOPOLOGIES, ids=lambda v: str(v))
def test_an_unseeded_sampler_in_a_mix_gives_every_sample_once_whatever_the_workers(
    make_sampler, num_workers, worker_mode
) -> None:
    """Each worker used to draw its own permutation: ~20 of 80 samples came twice, 20 never."""
    got = read_mix(sampled_mix(make_sampler), num_workers, worker_mode, seed=1)
    assert sorted(got) == [("a", i) for i in range(40)] + [("b", i) for i in range(40)]
    assert got == read_mix(sampled_mix(make_sampler), num_workers, worker_mode, seed=1)
    a_order = [i for tag, i in got if tag == "a"]
    assert a_order != list(range(40))  # shuffled, not read in index order


@pytest.mark.parametrize("make_sampler", list(SAMPLERS.values()), ids=list(SAMPLERS))
def test_the_loader_seed_decides_an_unseeded_sampler_and_0_or_1_workers_agree(
    make_sampler,
) -> None:
    main = read_mix(sampled_mix(make_sampler), 0, "process", seed=1)
    assert read_mix(sampled_mix(make_sampler), 1, "thread", seed=1) == main
    other = read_mix(sampled_mix(make_sampler), 0, "process", seed=2)
    assert sorted(other) == sorted(main) and other != main
    # the two sources' samplers are seeded apart: their permutations differ
    assert [i for t, i in main if t == "a"] != [i for t, i in main if t == "b"]


def test_a_seeded_sampler_keeps_its_own_order_in_every_worker() -> None:
    data = [("a", i) for i in range(40)]
    want = [data[i] for i in RandomSampler(data, generator=5)]  # its epoch 0
    for num_workers, worker_mode in TOPOLOGIES:
        mixed = mix([(data, RandomSampler(data, generator=5))])
        got = read_mix(mixed, num_workers, worker_mode, seed=num_workers)
        assert sorted(got) == sorted(data)
        # shard k of S reads positions k, k + S, ... of the order; the loader takes one from
        # each worker in turn
        shards = [want[k :: max(num_workers, 1)] for k in range(max(num_workers, 1))]
        assert got == [x for row in itertools.zip_longest(*shards) for x in row if x], (
            num_workers,
            worker_mode,
        )


@pytest.mark.torch
def test_a_torch_sampler_with_its_own_generator_gives_every_sample_once() -> None:
    torch = pytest.importorskip("torch", reason="the mix is given torch's own RandomSampler")
    data = [("a", i) for i in range(40)]

    def sampled(seed):
        generator = torch.Generator().manual_seed(seed)
        return mix([(data, torch.utils.data.RandomSampler(data, generator=generator))])

    got = read_mix(sampled(7), 2, "thread", seed=1)
    assert sorted(got) == sorted(data)
    assert got == read_mix(sampled(7), 2, "process", seed=3)  # its generator decides
    assert read_mix(sampled(8), 2, "process", seed=3) != got


def test_a_restarted_source_reshuffles_and_resumes_in_its_second_pass() -> None:
    small = [("s", i) for i in range(6)]
    big = [("b", i) for i in range(30)]

    def restarted():
        return mix([(small, RandomSampler(small)), big], on_exhausted="restart")

    whole = read_mix(restarted(), 0, "process", seed=4)
    passes = [[i for t, i in whole if t == "s"][k : k + 6] for k in (0, 6, 12)]
    assert all(sorted(p) == list(range(6)) for p in passes)
    assert len({tuple(p) for p in passes}) > 1  # each pass is a new permutation
    loader = DataLoader(restarted(), batch_size=None, generator=4)
    iterator = iter(loader)
    head = [tuple(x) for _, x in zip(range(17), iterator, strict=False)]  # in the 2nd pass
    state = loader.state_dict()
    del iterator
    resumed = DataLoader(restarted(), batch_size=None, generator=9)
    resumed.load_state_dict(state)
    assert head + [tuple(x) for x in resumed] == whole


# -- the mix's rank reaches its iterable sources ---------------------------------------------


def write_records(path, n: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps(["r", i]) + "\n")
    return str(path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_mix_rank_splits_its_stream_sources(tmp_path, num_workers) -> None:
    """A reader without a rank read every record on every rank of the mix."""
    path = write_records(tmp_path / "records.jsonl", 40)
    ranks = []
    for rank in (0, 1):
        mixed = mix([JsonLines(path)], rank=rank, world_size=2)
        ranks.append(
            [tuple(x) for x in DataLoader(mixed, batch_size=None, num_workers=num_workers)]
        )
    assert sorted(ranks[0] + ranks[1]) == [("r", i) for i in range(40)]
    assert not set(ranks[0]) & set(ranks[1])
    assert len(ranks[0]) == len(ranks[1]) == 20


def test_the_mix_rank_reaches_readers_inside_buffers_and_nested_mixes(tmp_path) -> None:
    path = write_records(tmp_path / "records.jsonl", 40)
    ranks = []
    for rank in (0, 1):
        inner = mix([ShuffleBuffer(JsonLines(path), 4, seed=1)])
        mixed = mix(
            [inner, [("m", i) for i in range(10)]], rank=rank, world_size=2, on_exhausted="drop"
        )
        assert (inner.rank, inner.world_size) == (rank, 2)
        ranks.append([tuple(x) for x in DataLoader(mixed, batch_size=None)])
    everything = sorted(ranks[0] + ranks[1])
    assert everything == [("m", i) for i in range(10)] + [("r", i) for i in range(40)]


def test_a_source_of_another_rank_than_the_mix_is_refused(tmp_path) -> None:
    path = write_records(tmp_path / "records.jsonl", 4)
    with pytest.raises(ValueError) as info:
        mix([[1, 2], ShuffleBuffer(JsonLines(path, rank=0, world_size=2), 2)], rank=1, world_size=2)
    assert str(info.value) == (
        "mix has rank=1 of world_size=2, but its source 1 (the JsonLines in ShuffleBuffer) has "
        "rank=0 of world_size=2: give the sources the mix's rank, or give them none (the mix "
        "passes its own to them)"
    )
    with pytest.raises(ValueError) as info:
        mix([Tagged("a", 4)], rank=1, world_size=2)
    assert str(info.value) == (
        "mix has rank=1 of world_size=2, but its source 0 (Tagged) is an iterable dataset "
        "without rank and world_size attributes, so the mix cannot pass its rank to it and "
        "every rank would read all of it: give it rank and world_size attributes and split "
        "its records by them (stoker's readers and ShardedIterable take rank= and "
        "world_size=), or make it map-style"
    )
    assert [x for x in mix([Tagged("a", 2)], rank=0, world_size=1)] == [("a", 0), ("a", 1)]
