"""on_error="skip": bad samples are left out, logged, reported, and budgeted."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

from stoker import DataLoader
from stoker.bad_samples import TooManyBadSamples

BAD = {3, 7, 8}


class Flaky:
    """Samples in BAD raise like a corrupt file would; describe_sample names the file."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        if i in BAD:
            raise OSError(f"image file is truncated ({i} bytes not processed)")
        return i

    def describe_sample(self, i: int) -> str:
        return f"/data/img_{i:03d}.jpg"


class FlakyBatched(Flaky):
    def __getitems__(self, indices):
        return [self[i] for i in indices]


CONFIGS = [{}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}]


@pytest.mark.parametrize("config", CONFIGS, ids=["main", "processes", "threads"])
@pytest.mark.parametrize("dataset", [Flaky(), FlakyBatched()], ids=["getitem", "getitems"])
def test_bad_samples_are_skipped_and_reported(config, dataset, caplog) -> None:
    loader = DataLoader(dataset, batch_size=4, on_error="skip", max_errors=None, **config)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        batches = [b.tolist() for b in loader]
    assert batches == [[0, 1, 2], [4, 5, 6], [9, 10, 11]]  # each batch one or two shorter
    report = loader.error_report()
    assert sorted(s.index for s in report) == sorted(BAD)
    first = min(report, key=lambda s: s.index)
    assert first.source == "/data/img_003.jpg"
    assert first.error_type == "OSError"
    assert "truncated" in first.message
    assert report.attempted == 12
    assert str(report).startswith("3 bad sample(s) skipped out of 12 attempted: 3 OSError")
    assert "index 3 (/data/img_003.jpg): OSError: image file is truncated" in str(report)
    logged = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    assert any("skipped a bad sample at index 7 (/data/img_007.jpg)" in m for m in logged)
    loader.close()


def test_a_batch_that_loses_every_sample_is_not_returned() -> None:
    loader = DataLoader(
        Flaky(), batch_size=2, sampler=[3, 7, 0, 1, 8], on_error="skip", max_errors=None
    )
    assert [b.tolist() for b in loader] == [[0, 1]]  # [3, 7] and [8] vanished whole


def test_past_the_budget_the_loader_stops_with_a_summary() -> None:
    loader = DataLoader(Flaky(), batch_size=4, on_error="skip", max_errors=2)
    with pytest.raises(TooManyBadSamples) as caught:
        list(loader)
    text = str(caught.value)
    assert text.startswith(
        "stopping: 3 bad samples exceed max_errors=2.\n3 bad sample(s) skipped out of 12"
    )
    assert "index 8 (/data/img_008.jpg)" in text
    assert text.endswith(
        "Fix or remove the broken files (stoker doctor helps), or raise max_errors."
    )


def test_a_fractional_budget_allows_that_share_of_attempted_samples() -> None:
    class OneInTen:
        def __len__(self) -> int:
            return 200

        def __getitem__(self, i: int) -> int:
            if i % 10 == 0:
                raise ValueError("bad")
            return i

    assert (
        sum(len(b) for b in DataLoader(OneInTen(), batch_size=20, on_error="skip", max_errors=0.2))
        == 180
    )
    with pytest.raises(TooManyBadSamples, match=r"exceed max_errors=0\.05"):
        list(DataLoader(OneInTen(), batch_size=20, on_error="skip", max_errors=0.05))


def test_skipping_with_workers_raises_past_the_budget_too() -> None:
    with pytest.raises(
        TooManyBadSamples, match=r"stopping: 2 bad samples exceed max_errors=1\.\n2 bad sample"
    ):
        list(DataLoader(Flaky(), batch_size=4, num_workers=2, on_error="skip", max_errors=1))


def test_by_default_errors_raise() -> None:
    with pytest.raises(OSError, match="truncated"):
        list(DataLoader(Flaky(), batch_size=4))
    assert len(DataLoader(Flaky()).error_report()) == 0


def test_collate_failures_are_not_bad_samples() -> None:
    class Ragged:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return np.zeros(i + 1)

    with pytest.raises(TypeError, match="cannot stack"):
        list(DataLoader(Ragged(), batch_size=4, on_error="skip"))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"on_error": "ignore"},
            ValueError,
            r"on_error must be one of \('raise', 'skip'\), got 'ignore'",
        ),
        (
            {"on_error": "skip", "max_errors": 1.5},
            ValueError,
            r"max_errors=1\.5: a float is a fraction",
        ),
        ({"on_error": "skip", "max_errors": -1}, ValueError, "max_errors must be >= 0, got -1"),
        ({"on_error": "skip", "max_errors": "5"}, TypeError, "max_errors must be None, a count"),
    ],
)
def test_bad_error_options(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        DataLoader(Flaky(), **kwargs)


def test_resume_counts_batches_that_lost_every_sample() -> None:
    from harness.save_load import run_test_save_load_state

    def make(resumed: bool):
        return DataLoader(
            Flaky(),
            batch_size=2,
            shuffle=True,
            generator=4,
            on_error="skip",
            max_errors=None,
            num_workers=2 if resumed else 0,
        )

    run_test_save_load_state(make, stop_at=3)


def test_every_skipped_record_and_batch_is_marked_with_one_value() -> None:
    from stoker._skipped import SKIPPED
    from stoker.formats.tar import TarShards
    from stoker.formats.text import JsonLines, TextLines

    assert TextLines._skip_marker is JsonLines._skip_marker is TarShards._skip_marker is SKIPPED
    assert pickle.loads(pickle.dumps(SKIPPED)) is SKIPPED  # stays itself wherever it travels
