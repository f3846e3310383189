"""``stoker doctor TARGET``: run the data pipeline self-checks over a dataset.

TARGET is one of:

* an image folder (one subfolder per class), read with
  :class:`stoker.formats.image_folder.ImageFolder`, resized and centre-cropped to
  ``--size`` (0 keeps each file's size);
* a packed dataset directory (it holds ``manifest.json``), read with
  :class:`stoker.formats.packed.PackedDataset`; images packed by ``stoker pack`` are
  decoded and resized like an image folder's;
* ``module:attr`` or ``path/to/file.py:attr``, naming a dataset object, or a class or
  function that returns one when called without arguments (the current directory is
  importable, as with ``python -m``).

The report is :func:`stoker.doctor.check`'s; ``--json`` prints it as JSON. The exit
status is 0 when no check failed (warnings are fine) and 1 otherwise, including when
TARGET cannot be loaded.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any

__all__ = ["add_parser", "load_target", "run"]

_MANIFEST_NAME = "manifest.json"  # stoker.formats._packed_spec.MANIFEST_NAME, without importing it


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="run the data pipeline self-checks over a dataset",
        description="Check a dataset the way the seeds did before every run: length, one sample's "
        "shapes, dtypes and value ranges, random or deterministic transform, a few batches, the "
        "label distribution, shuffling across epochs, and the per-channel mean and std to paste "
        "into Normalize.",
    )
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="an image folder (one subfolder per class), a packed dataset directory, or module:attr "
        "naming a dataset or a function that returns one",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="batch size of the loader checks (default 32)"
    )
    parser.add_argument(
        "--num-batches", type=int, default=3, help="batches loaded per epoch (default 3)"
    )
    parser.add_argument(
        "--stats-samples",
        type=int,
        default=200,
        help="samples the mean and std are computed over (default 200)",
    )
    parser.add_argument(
        "--num-workers", type=int, default=0, help="loader worker threads (default 0)"
    )
    parser.add_argument("--index", type=int, default=0, help="the sample to inspect (default 0)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the shuffled loader and the samples (default 0)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=224,
        help="images from a folder or `stoker pack`: resize the shorter side and centre-crop to this "
        "size, so they batch (default 224; 0 keeps each image's own size)",
    )
    parser.set_defaults(run=run)


class TargetError(ValueError):
    """TARGET names nothing the doctor can load."""


class _DecodePacked:
    """Decodes the images ``stoker pack`` stored: ``bytes`` or ``(bytes, label)`` records."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, record: Any) -> Any:
        from stoker.vision import decode_image

        data, label = record if isinstance(record, tuple) else (record, None)
        image = _resize_crop(decode_image(data, size_hint=self.size or None), self.size)
        return image if label is None else (image, label)


def _resize_crop(image: Any, size: int) -> Any:
    if not size:
        return image
    from stoker.vision import CenterCrop, Resize

    return CenterCrop(size)(Resize(size)(image))


class _ResizeCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Any) -> Any:
        return _resize_crop(image, self.size)


def load_target(spec: str, *, size: int = 224) -> tuple[Any, str]:
    """The dataset TARGET names, and how the report should name it.

    Raises:
        TargetError: TARGET is neither a directory nor ``module:attr``, or ``module:attr``
            does not resolve; errors raised while loading the dataset propagate.
    """
    if os.path.isdir(spec):
        if os.path.isfile(os.path.join(spec, _MANIFEST_NAME)):
            from stoker.formats.packed import PackedDataset

            dataset = PackedDataset(spec)
            if dataset.metadata.get("packed_by") == "stoker pack":
                dataset = PackedDataset(spec, transform=_DecodePacked(size))
                return dataset, f"packed images {spec}" + (
                    f" (decoded, resized and cropped to {size})" if size else ""
                )
            return dataset, f"packed dataset {spec}"
        from stoker.formats.image_folder import ImageFolder

        transform = _ResizeCrop(size) if size else None
        return ImageFolder(spec, transform=transform), f"image folder {spec}" + (
            f" (resized and cropped to {size})" if size else ""
        )
    module_name, colon, attr = spec.rpartition(":")
    if not colon or not module_name or not attr or os.path.exists(spec):
        msg = (
            f"TARGET {spec!r} is neither a directory (an image folder or a packed dataset) nor "
            "module:attr (like mypackage.data:train_set or data.py:make_dataset)"
        )
        raise TargetError(msg)
    obj = _import_attr(module_name, attr)
    if isinstance(obj, type) or (callable(obj) and not _looks_like_dataset(obj)):
        obj = obj()
    if not _looks_like_dataset(obj):
        msg = (
            f"{spec} is a {type(obj).__name__}, not a dataset: it needs __getitem__ and __len__, "
            "or __iter__ (an IterableDataset)"
        )
        raise TargetError(msg)
    return obj, spec


def _looks_like_dataset(obj: Any) -> bool:
    from stoker.datasets import is_iterable_dataset

    return (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")) or is_iterable_dataset(obj)


def _import_attr(module_name: str, attr: str) -> Any:
    if module_name.endswith(".py"):
        if not os.path.isfile(module_name):
            raise TargetError(f"no such file: {module_name!r}")
        name = "_stoker_doctor_" + os.path.splitext(os.path.basename(module_name))[0]
        spec = importlib.util.spec_from_file_location(name, module_name)
        if spec is None or spec.loader is None:
            raise TargetError(f"cannot import {module_name!r} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        added = os.getcwd() not in sys.path
        if added:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise TargetError(f"cannot import the module {module_name!r}: {exc}") from None
            raise
        finally:
            if added:
                sys.path.remove(os.getcwd())
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{module_name} has no attribute {attr!r}") from None
    return obj


def run(args: argparse.Namespace) -> int:
    from stoker.doctor import FAIL, DoctorReport, Finding, check

    try:
        dataset, description = load_target(args.target, size=args.size)
    except Exception as exc:
        message = (
            str(exc)
            if isinstance(exc, TargetError)
            else f"loading it raised {type(exc).__name__}: {exc}"
        )
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
            )
        except ValueError as exc:  # an option out of range
            print(f"stoker doctor: {exc}", file=sys.stderr)
            return 2
    print(report.to_json() if args.json else report.render())
    return report.exit_code
