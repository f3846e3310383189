""":func:`check`: validates the options, runs the checks in order, and builds the report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stoker._image_files import IMAGE_CHECKS
from stoker._validate import check_choice, check_int
from stoker.datasets import is_iterable_dataset
from stoker.doctor._checks import (
    check_batches,
    check_files,
    check_labels,
    check_length,
    check_sample,
    check_stats,
    check_transform,
    check_workers,
)
from stoker.doctor._context import Context, Options
from stoker.doctor.report import FAIL, SKIP, DoctorReport, in_reading_order, target_name

# The checks that need a sample, in the order they run. The batches check runs the
# shuffle check on its own loader; the labels check counts what the stats pass read.
_SAMPLE_CHECKS: tuple[tuple[str, Callable[[Context], None]], ...] = (
    ("transform", check_transform),
    ("workers", check_workers),
    ("batches", check_batches),
    ("stats", check_stats),
    ("labels", check_labels),
)


def check(
    dataset: Any,
    *,
    batch_size: int = 32,
    num_batches: int = 3,
    stats_samples: int = 200,
    num_workers: int = 0,
    index: int = 0,
    seed: int = 0,
    target: str | None = None,
    files: str = "decode",
    raw_images: bool = False,
) -> DoctorReport:
    """Runs the self-checks over ``dataset`` and returns what they found.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``) or an
            iterable dataset (index-based checks are then skipped).
        batch_size: the batch size of the loader the batch checks use.
        num_batches: how many batches to load per epoch (two epochs are loaded).
        stats_samples: how many samples (drawn at random without replacement) the
            mean and std are computed over.
        num_workers: loader workers (thread workers) for the batches and statistics.
        index: the sample to inspect and fetch twice.
        seed: seeds the shuffled loader and the choice of samples for the statistics.
        target: how the report names the dataset (default: its ``repr``).
        files: for a dataset of image files (one with a ``path(index)`` method, like
            :class:`~stoker.formats.image_folder.ImageFolder`), how every file is checked,
            as ``stoker pack`` checks them: ``"decode"`` (a full decode at reduced scale,
            which catches truncated files), ``"verify"`` (headers only) or ``"none"``. A
            file that is not a readable image is a failure.
        raw_images: the samples are images stoker decoded for the check (``stoker
            doctor FOLDER``), not the output of the caller's own pipeline: the warnings
            about raw uint8 pixels, unscaled values and channels-last layouts, which are
            about what a model is fed, are left out.

    Returns:
        A :class:`DoctorReport`; ``print(report)`` shows it, ``report.exit_code`` is 0
        when no check failed.

    Example:
        >>> report = check([(float(i), i % 2) for i in range(40)], batch_size=8, num_batches=2)
        >>> report.ok, next(f.message for f in report.findings if f.check == "labels")
        (True, 'sample[1]: 2 classes, most common 0 (50%)')
    """
    options = Options(
        batch_size=check_int("batch_size", batch_size, minimum=1),
        num_batches=check_int("num_batches", num_batches, minimum=1),
        stats_samples=check_int("stats_samples", stats_samples, minimum=1),
        num_workers=check_int("num_workers", num_workers),
        index=check_int("index", index),
        seed=check_int("seed", seed),
        files=check_choice("files", files, IMAGE_CHECKS),
        raw_images=bool(raw_images),
    )
    ctx = Context(dataset, options, iterable=is_iterable_dataset(dataset))
    if target is None:
        target = target_name(dataset)
    _run(ctx, "length", check_length)
    if ctx.length:
        _run(ctx, "files", check_files)
    if not any(f.status == FAIL for f in ctx.findings if f.check == "length"):
        _run(ctx, "sample", check_sample)
    if ctx.sample is not None:
        for name, run_check in _SAMPLE_CHECKS:
            _run(ctx, name, run_check)
    else:
        ctx.add("checks", SKIP, "the remaining checks need a sample; fix the failure above first")
    normalisation = ctx.normalisation
    return DoctorReport(
        target,
        in_reading_order(ctx.findings),
        stats_field=normalisation.field if normalisation else None,
        mean=normalisation.mean if normalisation else None,
        std=normalisation.std if normalisation else None,
    )


def _run(ctx: Context, name: str, run_check: Callable[[Context], None]) -> None:
    """Runs one check; a check that crashes is a failure, not a crash of the doctor."""
    try:
        run_check(ctx)
    except Exception as exc:
        ctx.add_raised(name, "the check", exc)
