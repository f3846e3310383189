"""``stoker doctor TARGET``: run the data pipeline self-checks over a dataset.

TARGET is an image folder, a packed dataset directory or ``module:attr``
(:func:`stoker.cli._target.load_target`, which this module re-exports as
:func:`load_target`).

The report is :func:`stoker.doctor.check`'s; ``--json`` prints it as JSON. For an image
folder every file is checked as ``stoker pack`` checks it (``--check``), and a file that
is not a readable image is a failure; the images the doctor decodes itself draw no
warnings about their dtype or layout (those are about the user's own transform).

Exit status: 0 when no check failed (warnings alone are fine), 1 when a check failed or
loading the dataset raised, 2 when TARGET names nothing loadable, an option is out of
range, or Pillow is missing for an image folder (the line names the extra to install).
"""

from __future__ import annotations

import argparse
from typing import Any

from stoker._extras import MissingExtraError
from stoker._image_files import IMAGE_CHECKS
from stoker.cli._args import nonnegative_int, positive_int
from stoker.cli._output import say, usage_error
from stoker.cli._target import (
    TargetError,
    add_size_argument,
    add_target_argument,
    decoded_here,
    load_target,
)

__all__ = ["add_parser", "load_target", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="run the data pipeline self-checks over a dataset",
        description="Check a dataset the way careful users do before every run: length, that "
        "every file of an image folder is a readable image, one sample's shapes, dtypes and "
        "value ranges, random or deterministic transform, a few batches, the label "
        "distribution, shuffling across epochs, and the per-channel mean and std to paste "
        "into Normalize. Exit status: 0 when no check failed (warnings are fine), 1 when one "
        "did, 2 when TARGET or an option is unusable.",
    )
    add_target_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="batch size of the loader checks (default 32)",
    )
    parser.add_argument(
        "--num-batches", type=positive_int, default=3, help="batches loaded per epoch (default 3)"
    )
    parser.add_argument(
        "--stats-samples",
        type=positive_int,
        default=200,
        help="samples the mean and std are computed over (default 200)",
    )
    parser.add_argument(
        "--num-workers",
        type=nonnegative_int,
        default=0,
        help="loader worker threads (default 0)",
    )
    parser.add_argument(
        "--index", type=nonnegative_int, default=0, help="the sample to inspect (default 0)"
    )
    parser.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="seed of the shuffled loader and the samples (default 0)",
    )
    parser.add_argument(
        "--check",
        choices=IMAGE_CHECKS,
        default="decode",
        help="how every file of an image folder is checked, as stoker pack does: decode "
        "(default; a full decode at reduced scale, catches truncated files), verify (headers "
        "only, faster) or none",
    )
    add_size_argument(
        parser,
        help_text="images from a folder or `stoker pack`: resize the shorter side and centre-crop "
        "to this size, so they batch (default 224; 0 keeps each image's own size)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stoker.doctor import FAIL, DoctorReport, Finding, check

    try:
        dataset, description = load_target(args.target, size=args.size, command="doctor")
    except TargetError as exc:
        return usage_error("doctor", str(exc))
    except MissingExtraError:
        raise
    except Exception as exc:  # the dataset's own code raised: a failure the report shows
        message = f"loading it raised {type(exc).__name__}: {exc}"
        report = DoctorReport(args.target, (Finding("load", FAIL, message),))
    else:
        try:
            report = check(
                dataset,
                batch_size=args.batch_size,
                num_batches=args.num_batches,
                stats_samples=args.stats_samples,
                num_workers=args.num_workers,
                index=args.index,
                seed=args.seed,
                target=description,
                files=args.check,
                raw_images=decoded_here(dataset),
            )
        except ValueError as exc:  # an option out of range
            return usage_error("doctor", str(exc))
    say(report.to_json() if args.json else report.render(), flush=False)
    return report.exit_code
