"""The resume oracle, drawn by hypothesis: any configuration, any save point, any allowed
way of resuming; the resumed run must continue the uninterrupted one (harness.oracle).

``pytest --hypothesis-profile=long tests/test_resume_oracle.py`` runs a deep search.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.oracle import ORACLE_SETTINGS, Config, Loading, SavePoint, check_resume

# the "stream-wrong-len" streams lie about their length on purpose: torch's warnings say so
pytestmark = [
    pytest.mark.filterwarnings("ignore:IterableDataset .* but its .* workers delivered"),
    pytest.mark.filterwarnings("ignore:Length of IterableDataset .* was reported to be"),
    pytest.mark.filterwarnings("ignore:len\\(dataloader\\) of IterableDataset"),
]


SAMPLERS = (
    "default",
    "shuffle",
    "random",
    "random-replacement",
    "weighted",
    "distributed",
    "shards",
    "bucketing",
)


DATASETS = ("map", "stream", "stream-wrong-len", "stream-stateless", "own-iterator", "shuffled")
TORCH_SAMPLERS = (*SAMPLERS, "torch-random", "torch-random-generator")
TWO = Loading(num_workers=2)
TWO_KEPT = Loading(num_workers=2, persistent_workers=True)


@st.composite
def loadings(draw: st.DrawFn, *, map_style: bool, pin: bool = False) -> Loading:
    """How a loader loads. Streams get process workers: thread workers share one dataset
    object, and these streams keep their place on it (a stream read by threads must keep it
    per iterator)."""
    workers = draw(st.integers(0, 3))
    pin_memory = pin and draw(st.booleans())
    if not workers:
        return Loading(pin_memory=pin_memory)
    modes = ["process", "thread", "auto"] if map_style else ["process"]
    return Loading(
        pin_memory=pin_memory,
        num_workers=workers,
        worker_mode=draw(st.sampled_from(modes)),
        in_order=draw(st.booleans()),
        persistent_workers=draw(st.booleans()),
        prefetch_factor=draw(st.sampled_from([None, 1, 3])),
    )


@st.composite
def configs(draw: st.DrawFn, *, torch: bool = False) -> Config:
    """A configuration; ``torch``: read by stoker.torch.DataLoader, with torch's samplers,
    a torch.Generator and pinning among the choices."""
    dataset = draw(st.sampled_from(DATASETS))
    stream = dataset != "map"
    sampler = "default" if stream else draw(st.sampled_from(TORCH_SAMPLERS if torch else SAMPLERS))
    batch_size = draw(st.sampled_from([None, 1, 2, 3, 5]))
    config = Config(
        dataset=dataset,
        n=draw(st.integers(1, 23)),
        batch_size=batch_size,
        drop_last=batch_size is not None and draw(st.booleans()),
        sampler=sampler,
        seed=draw(st.one_of(st.none(), st.integers(0, 2**31 - 1))),
        torch_loader=torch,
        torch_generator=torch and draw(st.booleans()),
        loading=draw(loadings(map_style=not stream, pin=torch)),
        resumed=draw(loadings(map_style=not stream, pin=torch)),
        epochs=draw(st.integers(1, 3)),
        global_seed=draw(st.integers(0, 99)),
    )
    return config.allowed()


@st.composite
def save_points(draw: st.DrawFn, epochs: int) -> SavePoint:
    batches = draw(st.one_of(st.sampled_from([-2, -1, None]), st.integers(0, 12)))
    return SavePoint(epoch=draw(st.integers(0, epochs - 1)), batches=batches)


@ORACLE_SETTINGS
@given(data=st.data())
def test_a_resumed_loader_continues_the_uninterrupted_run(data: st.DataObject) -> None:
    config = data.draw(configs(), label="config")
    point = data.draw(save_points(config.epochs), label="save point")
    check_resume(config, point)


@ORACLE_SETTINGS
@given(data=st.data())
def test_a_resumed_torch_loader_continues_the_uninterrupted_run(data: st.DataObject) -> None:
    pytest.importorskip("torch", reason="draws stoker.torch loaders, torch samplers and generators")
    config = data.draw(configs(torch=True), label="config")
    point = data.draw(save_points(config.epochs), label="save point")
    check_resume(config, point)


@pytest.mark.parametrize(
    ("config", "point"),
    [
        # found by the oracle, kept as examples: (each says what went wrong before)
        (Config(dataset="map", seed=None), SavePoint(0, -2)),
        # a stream that rewinds itself at its end, saved after a worker's last batch (before
        # the loop's StopIteration): that worker's stream was read again
        (Config(dataset="stream", n=7, loading=TWO, resumed=TWO), SavePoint(0, 3)),
        (Config(dataset="stream", n=7, loading=TWO_KEPT, resumed=TWO_KEPT), SavePoint(0, 3)),
        # a buffer over that stream, the stream run out: saved while the buffer drained, or
        # after its last sample (batch_size=None: before the loader saw the end), the resumed
        # buffer read the stream again
        (Config(dataset="shuffled", n=5, batch_size=None), SavePoint(0, 5)),
        (Config(dataset="shuffled", n=5, batch_size=2), SavePoint(0, 2)),
        (
            Config(dataset="shuffled", n=9, batch_size=None, loading=TWO, resumed=TWO),
            SavePoint(0, 8),
        ),
        # a dataset that is its own iterator, its state loaded before the iter() that rewinds
        # it, restarted its epoch; a stream without a state was refused mid-epoch (replayed)
        (Config(dataset="own-iterator", n=6), SavePoint(0, 2)),
        (Config(dataset="stream-stateless", loading=Loading(num_workers=1)), SavePoint(0, 2)),
    ],
)
def test_resume_oracle_examples(config: Config, point: SavePoint) -> None:
    assert check_resume(config, point) == "resumed"
