"""mix(): exact proportions over windows, exhaustion policies, determinism, workers, resume."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from stoker import DataLoader, IterableDataset, Mix, RandomSampler, ShuffleBuffer, mix
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
