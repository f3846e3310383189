"""TARGET, the dataset ``stoker doctor`` and ``stoker bench`` work on, and its arguments.

TARGET is one of:

* an image folder (one subfolder per class), read with
  :class:`stoker.formats.image_folder.ImageFolder`, resized and centre-cropped to
  ``--size`` (0 keeps each file's size);
* a packed dataset directory (it holds ``manifest.json``), read with
  :class:`stoker.formats.packed.PackedDataset`; images packed by ``stoker pack`` (or any
  pack of image bytes, or of ``(image bytes, label)`` records) are decoded with
  :class:`stoker.vision.DecodeImage` and resized like an image folder's, so a folder and
  its packed copy give the same samples;
* ``module:attr`` or ``path/to/file.py:attr``, naming a dataset object, or a class or
  function that returns one when called without arguments (the current directory is
  importable, as with ``python -m``).

Decoding the images of a folder or of ``stoker pack`` needs Pillow (the ``image`` extra):
without it :func:`load_target` raises :class:`stoker._extras.MissingExtraError`, whose
message names the extra, before any sample is read.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import weakref
from typing import Any

from stoker._extras import require
from stoker._printable import printable
from stoker.cli._args import nonnegative_int, positive_int

__all__ = [
    "DEFAULT_SIZE",
    "TargetError",
    "add_size_argument",
    "add_target_argument",
    "decoded_here",
    "load_target",
]

_MANIFEST_NAME = "manifest.json"  # stoker.formats._packed_spec.MANIFEST_NAME, without importing it
DEFAULT_SIZE = 224  # the square images from a folder or `stoker pack` are resized and cropped to
_FORMS = (
    "an image folder (one subfolder per class), a packed dataset directory, or module:attr "
    "naming a dataset or a function that returns one"
)


def add_target_argument(parser: argparse.ArgumentParser, *, lead: str = "") -> None:
    """The TARGET argument; its help is ``lead`` followed by the forms TARGET takes."""
    parser.add_argument("target", metavar="TARGET", help=lead + _FORMS)


def add_size_argument(
    parser: argparse.ArgumentParser, *, help_text: str, zero_keeps_size: bool = True
) -> None:
    """``--size``: the square images from a folder or ``stoker pack`` become (``load_target``).

    0 (each image keeps its own size) is a valid value only with ``zero_keeps_size``.
    """
    kind = nonnegative_int if zero_keeps_size else positive_int
    parser.add_argument("--size", type=kind, default=DEFAULT_SIZE, metavar="PIXELS", help=help_text)


class TargetError(ValueError):
    """TARGET names nothing the doctor can load."""


_DECODED_HERE: weakref.WeakSet[Any] = weakref.WeakSet()  # datasets load_target decodes
# how the encoded images stoker packs begin: JPEG, PNG, GIF, BMP, TIFF (both byte orders), WebP
_IMAGE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"II*\x00", b"MM\x00*", b"RIFF")


def _fit(size: int) -> Any:
    """Resize the shorter side to ``size`` and centre-crop to ``size`` x ``size``, or None.

    The public transforms, so JPEGs are decoded at reduced size alike from a folder
    (ImageFolder) and from a pack (DecodeImage): the two give the same pixels.
    """
    if not size:
        return None
    from stoker.vision import CenterCrop, Compose, Resize

    return Compose([Resize(size), CenterCrop(size)])


def _holds_images(dataset: Any) -> bool:
    """Whether a packed dataset's records are encoded images: written by ``stoker pack``, or
    of its schema (image bytes, or image bytes and an int label) with an image's signature."""
    if dataset.metadata.get("packed_by") == "stoker pack":
        return True
    schema = dataset.manifest.get("schema") or {}
    kinds = [field.get("kind") for field in schema.get("fields", ())]
    layout = schema.get("layout")
    if not (
        (layout == "single" and kinds == ["bytes"])
        or (layout == "tuple" and kinds == ["bytes", "int"])
    ):
        return False
    if len(dataset) == 0:
        return False
    record = dataset[0]
    data = bytes(record[0] if layout == "tuple" else record)
    return data.startswith(_IMAGE_SIGNATURES)


def load_target(spec: str, *, size: int = DEFAULT_SIZE, command: str = "doctor") -> tuple[Any, str]:
    """The dataset TARGET names, and how the report should name it.

    ``command`` (``"doctor"``, ``"bench"``) names the command in the message about a
    missing package.

    Raises:
        TargetError: TARGET is neither a directory nor ``module:attr``, or ``module:attr``
            does not resolve; errors raised while loading the dataset propagate.
        stoker._extras.MissingExtraError: TARGET holds images and Pillow is missing.
    """
    if os.path.isdir(spec):
        if os.path.isfile(os.path.join(spec, _MANIFEST_NAME)):
            from stoker.formats.packed import PackedDataset

            dataset = PackedDataset(spec)
            if _holds_images(dataset):
                from stoker.vision import DecodeImage

                require("PIL", f"stoker {command}", "to decode images")
                dataset = PackedDataset(spec, transform=DecodeImage(_fit(size)))
                _DECODED_HERE.add(dataset)
                return dataset, f"packed images {printable(spec)}" + (
                    f" (decoded, resized and cropped to {size})" if size else ""
                )
            return dataset, f"packed dataset {printable(spec)}"
        from stoker.formats.image_folder import ImageFolder

        require("PIL", f"stoker {command}", "to decode images")
        folder = ImageFolder(spec, transform=_fit(size))
        _DECODED_HERE.add(folder)
        return folder, f"image folder {printable(spec)}" + (
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
            f"{printable(spec)} is a {type(obj).__name__}, not a dataset: it needs __getitem__ "
            "and __len__, or __iter__ (an IterableDataset)"
        )
        raise TargetError(msg)
    return obj, spec


def decoded_here(dataset: Any) -> bool:
    """Whether :func:`load_target` decodes ``dataset``'s images itself (a folder or packed
    images): its samples are then stoker's decoding, not the user's own transform's output."""
    from stoker.formats.image_folder import ImageFolder

    if dataset in _DECODED_HERE:
        return True
    return isinstance(dataset, ImageFolder) and dataset.transform is None


def _looks_like_dataset(obj: Any) -> bool:
    from stoker.datasets import is_iterable_dataset

    return (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")) or is_iterable_dataset(obj)


def _import_attr(module_name: str, attr: str) -> Any:
    if module_name.endswith(".py"):
        module = _import_file(module_name)
    else:
        module = _import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{module_name} has no attribute {attr!r}") from None
    return obj


def _import_file(path: str) -> Any:
    """``path/to/file.py`` imported as a module of its own."""
    if not os.path.isfile(path):
        raise TargetError(f"no such file: {path!r}")
    name = "_stoker_doctor_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _import_module(module_name: str) -> Any:
    """``module_name`` imported with the current directory importable, as ``python -m`` does."""
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise TargetError(f"cannot import the module {module_name!r}: {exc}") from None
        raise
    finally:
        if added:
            sys.path.remove(os.getcwd())
