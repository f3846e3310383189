"""Damaged or edited stream states: a ValueError naming the entry, never other records.

A state is checked when it is loaded (``load_state_dict``), before anything is read; what
needs the shard (which records this worker reads) when the iteration starts, and a read
position past the end of its file when the stream reaches that file. The property test
mutates valid states the ways a hand edit or a damaged checkpoint would (an entry dropped,
an int made negative, huge or a string, a buffered position repeated) and asserts that
each is either refused with a message naming the entry or resumes exactly as the
uninterrupted run goes on.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import IterableDataset, Mix, RandomSampler, ShuffleBuffer, mix
from stoker.formats.text import JsonLines

RECORDS = 24  # over two files: records i % 2 == k in file k


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("records")
    for k in range(2):
        with open(root / f"part-{k}.jsonl", "w") as f:
            for i in range(k, RECORDS, 2):
                f.write(json.dumps(i) + "\n")
    return str(root)


def reader(folder: str) -> JsonLines:
    return JsonLines(folder, shuffle_buffer=4)


def mixed(folder: str, policy: str = "drop") -> Mix:
    items = [("m", i) for i in range(10)]
    return mix([reader(folder), (items, RandomSampler(items, generator=3))], on_exhausted=policy)


def head_and_state(make: Callable[[], Any], taken: int) -> tuple[list[Any], list[Any], dict]:
    """The whole run, the first ``taken`` items of another, and its state after them."""
    whole = list(make())
    stream = make()
    iterator = iter(stream)
    head = [next(iterator) for _ in range(taken)]
    return whole, head, stream.state_dict()


def state_after(make: Callable[[], Any], taken: int) -> dict:
    return head_and_state(make, taken)[2]


def refusal(make: Callable[[], Any], state: Any) -> str:
    """The message of the ValueError that loading ``state``, then reading on, raises."""
    stream = make()
    with pytest.raises(ValueError) as info:
        stream.load_state_dict(state)
        list(stream)
    return str(info.value)


def assert_resumes(make: Callable[[], Any], state: dict, head: list, whole: list) -> None:
    """The unedited state resumes exactly where the uninterrupted run goes on."""
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole


def damaged(owner: str) -> str:
    return f"(the state is damaged or was edited; load one that {owner}.state_dict() saved)"


# -- each kind of damage, with its message ------------------------------------------------


def test_a_reader_state_with_a_bad_position_is_refused_naming_it(folder) -> None:
    state = state_after(lambda: reader(folder), 3)
    assert state["read"] == [0, 5] and state["buffer"].tolist() == [[0, 0], [0, 1], [0, 5]]
    make = lambda: reader(folder)
    must = "must be [file, record]: ints in [0, 2**63), the file in [0, 1] (2 files)"

    assert refusal(make, {**state, "read": [0, -1]}) == (
        f"JsonLines.load_state_dict: state['read'] {must}, got [0, -1] {damaged('JsonLines')}"
    )
    in_file_9 = {**state, "buffer": np.array([[0, 0], [9, 1], [0, 5]])}
    assert refusal(make, in_file_9) == (
        f"JsonLines.load_state_dict: state['buffer'][1] {must}, got [9, 1] {damaged('JsonLines')}"
    )
    assert refusal(make, {**state, "read": [0, 1.0]}) == (
        f"JsonLines.load_state_dict: state['read'] {must}, got [0, 1.0] {damaged('JsonLines')}"
    )
    assert refusal(make, {**state, "epoch": "0"}) == (
        "JsonLines.load_state_dict: state['epoch'] must be an int >= 0, got '0' "
        f"{damaged('JsonLines')}"
    )


def test_a_repeated_buffer_position_is_refused_instead_of_delivered_again(folder) -> None:
    """Three copies of one buffered position delivered record 0 three times."""
    whole, head, state = head_and_state(lambda: reader(folder), 3)
    repeated = {**state, "buffer": np.array([[0, 0], [0, 0], [0, 0]])}
    assert refusal(lambda: reader(folder), repeated) == (
        "JsonLines.load_state_dict: state['buffer'][1] must be a position of its own "
        f"(state['buffer'][0] holds it too), got (0, 0) {damaged('JsonLines')}"
    )
    assert_resumes(lambda: reader(folder), state, head, whole)


def test_positions_past_the_end_or_after_the_last_read_are_refused(folder) -> None:
    state = state_after(lambda: reader(folder), 3)
    make = lambda: reader(folder)
    assert refusal(make, {**state, "read": [0, 1000]}) == (
        "JsonLines: state['read'] is record 1000 of file 0, past the end of that file; the "
        "files changed since the state was saved, or it was edited: resume with the files it "
        "was saved with"
    )
    after = {**state, "buffer": np.array([[0, 0], [0, 1], [1, 2]])}
    assert refusal(make, after) == (
        "JsonLines: state['buffer'][2] is record 2 of file 1, which comes after state['read'] "
        "(record 5 of file 0): a buffered record was read before it (the state is damaged or "
        "was edited; load one that JsonLines.state_dict() saved)"
    )
    at_4 = reader(folder)
    it = iter(at_4)
    [next(it) for _ in range(14)]  # into file 1: file 0's records all read
    later = at_4.state_dict()
    assert later["read"][0] == 1
    past = {**later, "buffer": np.array([[0, 500], *later["buffer"][1:].tolist()])}
    assert refusal(make, past) == (
        "JsonLines: cannot re-read the record(s) at (file, record) [(0, 500)] that "
        "state['buffer'] holds: past the end of the file or a record it skips; the files "
        "changed since the state was saved, or it was edited"
    )


def test_a_state_of_another_kind_or_missing_an_entry_is_refused(folder) -> None:
    state = state_after(lambda: reader(folder), 3)
    assert refusal(lambda: reader(folder), {**state, "kind": "stoker.mix"}) == (
        "JsonLines.load_state_dict expects a state saved by JsonLines.state_dict(), whose "
        "'kind' is 'stoker.stream'; got one whose 'kind' is 'stoker.mix'"
    )
    assert refusal(lambda: mixed(folder), state) == (
        "Mix.load_state_dict expects a state saved by Mix.state_dict(), whose 'kind' is "
        "'stoker.mix'; got one whose 'kind' is 'stoker.stream'"
    )
    assert refusal(lambda: reader(folder), [1, 2]) == (
        "JsonLines.load_state_dict expects a state saved by JsonLines.state_dict(), whose "
        "'kind' is 'stoker.stream'; got a list: [1, 2]"
    )
    no_rng = {k: v for k, v in state.items() if k != "rng"}
    assert refusal(lambda: reader(folder), no_rng) == (
        f"JsonLines.load_state_dict: the state has no 'rng' entry {damaged('JsonLines')}"
    )


def test_a_buffered_state_is_refused_by_a_smaller_buffer_or_none(folder) -> None:
    state = state_after(lambda: reader(folder), 3)
    assert refusal(lambda: JsonLines(folder), state) == (
        "JsonLines.load_state_dict: state['buffer'] must be at most 0 positions, as the state "
        "is loaded into a reader without shuffle_buffer, got 3 positions "
        f"{damaged('JsonLines')}"
    )
    assert refusal(lambda: JsonLines(folder, shuffle_buffer=2), state).startswith(
        "JsonLines.load_state_dict: state['buffer'] must be at most 2 positions, as the state "
        "is loaded into a buffer of 2 records, got 3 positions"
    )


def test_a_broken_generator_state_is_refused(folder) -> None:
    state = state_after(lambda: reader(folder), 3)
    rng = copy.deepcopy(state["rng"])
    rng["state"]["inc"] = -3
    assert refusal(lambda: reader(folder), {**state, "rng": rng}) == (
        "JsonLines.load_state_dict: state['rng'] must be the state of a PCG64 generator "
        "(bit_generator 'PCG64', state and an odd inc, ints in [0, 2**128), has_uint32 0 or "
        f"1, uinteger in [0, 2**32)), got {rng!r} {damaged('JsonLines')}"
    )


def test_a_mix_state_with_bad_entries_is_refused_naming_them(folder) -> None:
    whole, head, state = head_and_state(lambda: mixed(folder), 5)
    assert {k: v for k, v in state.items() if k != "sources"} == {
        "kind": "stoker.mix",
        "epoch": 0,
        "shard": [0, 1],
        "step": 5,
        "credit": [-0.5, 0.5],
        "active": [True, True],
        "ran_out": [False, False],
    }
    assert state["sources"][1] == {"taken": 2, "passes": 0}
    make = lambda: mixed(folder)
    end = damaged("Mix")
    assert refusal(make, {**state, "sources": state["sources"][:1]}) == (
        f"Mix.load_state_dict: state['sources'] must be a list of 2 items, got a list of 1 {end}"
    )
    assert refusal(make, {**state, "step": -1}) == (
        f"Mix.load_state_dict: state['step'] must be an int >= 0, got -1 {end}"
    )
    assert refusal(make, {**state, "credit": [-7.5, 0.5]}) == (
        f"Mix.load_state_dict: state['credit'][0] must be a number in (-1, 1), got -7.5 {end}"
    )
    assert refusal(make, {**state, "credit": [-0.25, 0.5]}) == (
        f"Mix.load_state_dict: state['credit'] must be credits that sum to 0, got "
        f"[-0.25, 0.5] {end}"
    )
    taken = {**state, "sources": [state["sources"][0], {"taken": -2, "passes": 0}]}
    assert refusal(make, taken) == (
        f"Mix.load_state_dict: state['sources'][1]['taken'] must be an int in [0, 10], got -2 {end}"
    )
    passes = {**state, "sources": [state["sources"][0], {"taken": 2, "passes": 1}]}
    assert refusal(make, passes) == (
        "Mix.load_state_dict: state['sources'][1]['passes'] must be 0: only a source that ran "
        "out is restarted, under on_exhausted='restart' (this mix: 'drop', "
        f"state['ran_out'][1] is False), got 1 {end}"
    )
    inner = {**state["sources"][0], "read": [0, -1]}
    assert refusal(make, {**state, "sources": [inner, state["sources"][1]]}) == (
        "Mix.load_state_dict: state['sources'][0]: JsonLines.load_state_dict: state['read'] "
        "must be [file, record]: ints in [0, 2**63), the file in [0, 1] (2 files), got [0, -1] "
        f"{damaged('JsonLines')}"
    )
    assert refusal(make, {**state, "epoch": 2}) == (
        "Mix.load_state_dict: state['sources'][0]['epoch'] must be 2, the mix's "
        f"state['epoch'], got 0 {end}"
    )
    assert_resumes(lambda: mixed(folder), state, head, whole)


def test_a_restarted_source_cannot_claim_more_passes_than_the_draws(folder) -> None:
    state = state_after(lambda: mixed(folder, "restart"), 30)
    assert state["sources"][1]["passes"] == 1 and state["ran_out"] == [False, True]
    edited = copy.deepcopy(state)
    edited["sources"][1]["passes"] = 3
    assert refusal(lambda: mixed(folder, "restart"), edited) == (
        f"Mix: state['sources'][1] is {{'taken': {state['sources'][1]['taken']}, 'passes': 3}}:"
        " more samples of source 1 (10 a pass) than the 30 draws of state['step'] can have "
        f"read {damaged('Mix')}"
    )


class Counting(IterableDataset):
    """0, 1, ..., n - 1, resumable (a stream that is not one of stoker's readers)."""

    def __init__(self, n: int) -> None:
        self.n, self.start = n, 0

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, self.n):
            self.next = i + 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"next": getattr(self, "next", 0)}

    def load_state_dict(self, state) -> None:
        if not isinstance(state.get("next"), int) or state["next"] < 0:
            raise ValueError(f"Counting: state['next'] must be an int >= 0, got {state!r}")
        self.start = state["next"]


def test_a_shuffle_buffer_of_samples_checks_its_state(folder) -> None:
    make = lambda: ShuffleBuffer(Counting(20), 4, seed=1)
    whole, head, state = head_and_state(make, 5)
    assert state["kind"] == "stoker.shuffle_buffer" and len(state["samples"]) == 3
    assert refusal(lambda: ShuffleBuffer(Counting(20), 2, seed=1), state) == (
        "ShuffleBuffer.load_state_dict: state['samples'] must be at most 2 samples, as the "
        "state is loaded into a buffer of 2, got 3 samples (the state is damaged or was "
        "edited; load one that ShuffleBuffer.state_dict() saved)"
    )
    assert refusal(make, {**state, "rng": None}) == (
        "ShuffleBuffer.load_state_dict: state['rng'] must be a generator's state once samples "
        "were buffered, got None (the state is damaged or was edited; load one that "
        "ShuffleBuffer.state_dict() saved)"
    )
    with pytest.raises(ValueError, match=r"Counting: state\['next'\] must be an int >= 0"):
        make().load_state_dict({**state, "inner": {"next": -4}})  # checked at load time
    assert_resumes(make, state, head, whole)


class Rewinding(Counting):
    """A :class:`Counting` that rewinds itself at its end: its state is then the next epoch's."""

    def __iter__(self):
        yield from super().__iter__()
        self.next = 0


# -- an epoch's start and a source's end: the forms the loader's captures give -------------


def test_a_buffers_state_at_an_epochs_start_resumes_and_half_of_one_is_refused() -> None:
    make = lambda: ShuffleBuffer(Counting(20), 4, seed=1)
    start = make().state_dict()
    assert start == {
        "kind": "stoker.shuffle_buffer",
        "epoch": None,
        "shard": None,
        "samples": [],
        "inner": {"next": 0},
        "rng": None,
        "ran_out": False,
    }
    assert_resumes(make, start, [], list(make()))
    end = damaged("ShuffleBuffer")
    assert refusal(make, {**start, "shard": [0, 1]}) == (
        "ShuffleBuffer.load_state_dict: state['epoch'] must be an int >= 0 while "
        f"state['shard'] is [0, 1] (both None: epoch start), got None {end}"
    )
    assert refusal(make, {**start, "epoch": 0}) == (
        "ShuffleBuffer.load_state_dict: state['shard'] must be [index, count] while "
        f"state['epoch'] is 0 (both None: epoch start), got None {end}"
    )
    assert refusal(make, {**start, "samples": [3]}) == (
        "ShuffleBuffer.load_state_dict: state['samples'] must be [] in a state of an epoch's "
        f"start (state['epoch'] and state['shard'] None), got 1 samples {end}"
    )
    assert refusal(make, {**start, "ran_out": True}) == (
        "ShuffleBuffer.load_state_dict: state['ran_out'] must be False in a state of an "
        f"epoch's start (state['epoch'] and state['shard'] None), got True {end}"
    )


@pytest.mark.parametrize("taken", range(1, 7))
def test_a_buffer_whose_stream_rewinds_at_its_end_does_not_read_it_again(taken) -> None:
    """The stream ran out while the buffer drained: its state is the next epoch's, and the
    resumed buffer read the whole stream again (the resume oracle's "shuffled" stream)."""
    make = lambda: ShuffleBuffer(Rewinding(6), 4, seed=1)
    whole, head, state = head_and_state(make, taken)
    assert state["ran_out"] == (taken >= 4)  # its 4th sample comes after the stream's end
    assert_resumes(make, state, head, whole)
    assert refusal(make, {**state, "ran_out": 1}) == (
        "ShuffleBuffer.load_state_dict: state['ran_out'] must be True or False, got 1 "
        f"{damaged('ShuffleBuffer')}"
    )


@pytest.mark.parametrize("source", ["reader", "buffer"])
def test_a_mix_resumes_after_a_source_ran_out_whatever_state_that_source_left(
    folder, source
) -> None:
    """A reader that ran out holds no state (None), a buffer of samples an epoch's start."""
    items = [("m", i) for i in range(40)]

    def make() -> Mix:
        first = JsonLines(folder) if source == "reader" else ShuffleBuffer(Rewinding(6), 4, seed=1)
        return mix([first, (items, RandomSampler(items, generator=3))], on_exhausted="drop")

    whole, head, state = head_and_state(make, 50 if source == "reader" else 14)
    assert state["ran_out"] == [True, False] and state["active"] == [False, True]
    if source == "reader":
        assert state["sources"][0] is None
    else:
        assert (state["sources"][0]["epoch"], state["sources"][0]["shard"]) == (None, None)
    assert_resumes(make, state, head, whole)
    mid = state_after(make, 5)
    name = "JsonLines" if source == "reader" else "ShuffleBuffer"
    assert refusal(make, {**mid, "sources": [None, mid["sources"][1]]}) == (
        f"Mix.load_state_dict: state['sources'][0] must be the state of its {name}: None only "
        f"once it ran out (state['ran_out'][0] is False), got None {damaged('Mix')}"
    )
    if source == "buffer":  # the epoch's start it saved after its end, given while it ran
        started = {**mid, "sources": [state["sources"][0], mid["sources"][1]]}
        assert refusal(make, started) == (
            "Mix.load_state_dict: state['sources'][0]['epoch'] must be 0, the mix's "
            "state['epoch']: None (an epoch's start) only once it ran out (state['ran_out'][0] "
            f"is False), got None {damaged('Mix')}"
        )


# -- the property: any such edit is refused by name, or changes nothing -------------------


def leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every int or float in a state (bools are flags, not counts)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in leaves(v, (*path, k))]
    if isinstance(value, (list, tuple, np.ndarray)):
        rows = value.tolist() if isinstance(value, np.ndarray) else value
        return [p for i, v in enumerate(rows) for p in leaves(v, (*path, i))]
    if isinstance(value, (int, float, np.integer)) and not isinstance(value, bool):
        return [path]
    return []


def dicts(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every entry of every dict in a state."""
    if isinstance(value, dict):
        return [(*path, k) for k in value] + [
            p for k, v in value.items() for p in dicts(v, (*path, k))
        ]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in dicts(v, (*path, i))]
    return []


def buffers(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every non-empty buffer of positions in a state."""
    if isinstance(value, dict):
        here = [(*path, "buffer")] if len(value.get("buffer", ())) else []
        return here + [p for k, v in value.items() for p in buffers(v, (*path, k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in buffers(v, (*path, i))]
    return []


def parent(state: Any, path: tuple) -> Any:
    for step in path[:-1]:
        state = state[step]
    return state


def mutated(state: dict, how: str, path: tuple) -> dict:
    state = copy.deepcopy(state)
    for p in buffers(state):  # arrays to lists, so an entry can be set by its path
        parent(state, p)[p[-1]] = parent(state, p)[p[-1]].tolist()
    holder = parent(state, path)
    if how == "drop":
        del holder[path[-1]]
    elif how == "repeat":
        holder[path[-1]] = [*holder[path[-1]], holder[path[-1]][0]]
    else:
        old = holder[path[-1]]
        holder[path[-1]] = {"negative": -1 - abs(old), "huge": 10**40, "string": str(old)}[how]
    return state


def named_entry(path: tuple) -> str:
    """The innermost key of the state that ``path`` goes through."""
    return next(str(step) for step in reversed(path) if isinstance(step, str))


def check_edit(make: Callable[[], Any], taken: int, data: st.DataObject) -> None:
    whole, head, state = head_and_state(make, taken)
    edits = [("drop", p) for p in dicts(state)] + [("repeat", p) for p in buffers(state)]
    edits += [(how, p) for p in leaves(state) for how in ("negative", "huge", "string")]
    how, path = data.draw(st.sampled_from(edits), label="edit")
    edited = mutated(state, how, path)
    stream = make()
    try:
        stream.load_state_dict(edited)
        rest = list(stream)
    except ValueError as exc:
        assert named_entry(path) in str(exc), (how, path, str(exc))
        return
    assert head + rest == whole, (how, path)


@settings(max_examples=150, deadline=None)
@given(taken=st.integers(1, RECORDS - 1), data=st.data())
def test_an_edited_reader_state_is_refused_by_name_or_resumes_exactly(folder, taken, data) -> None:
    check_edit(lambda: reader(folder), taken, data)


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["drop", "restart"]),
    taken=st.integers(1, RECORDS + 3),
    data=st.data(),
)
def test_an_edited_mix_state_is_refused_by_name_or_resumes_exactly(
    folder, policy, taken, data
) -> None:
    check_edit(lambda: mixed(folder, policy), taken, data)
