"""Decoding the image inside a record, then transforming it: what ImageFolder does per file.

:class:`DecodeImage` is the record transform for datasets that store encoded images, such
as the ``(jpeg bytes, label)`` records ``stoker pack`` writes::

    PackedDataset("packed/train", transform=DecodeImage(train_transform(224)))

gives the same ``(image, label)`` samples, bit for bit, as
``ImageFolder("photos/train", transform=train_transform(224))``: both call
:func:`decode_and_transform`, so they use the same decoder, the same reduced-size JPEG
decoding (from the transform's ``decode_size_hint``) and the same per-sample random draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._extras import require
from stoker._thread_safety import is_thread_safe
from stoker._validate import check_choice
from stoker.vision.decode import (
    PILLOW_LIMIT,
    MaxPixels,
    SizeHint,
    _simplejpeg,
    check_max_pixels,
    check_size_hint,
    decode_image,
)
from stoker.vision.fused import decode_cropped, region_decoded
from stoker.vision.transforms import call_with_shared_rng

__all__ = ["DECODE_CHOICES", "DecodeImage", "check_decode_options", "decode_and_transform"]

DECODE_CHOICES = ("auto", "simplejpeg", "pillow", "pil")


def check_decode_options(
    decode: str,
    size_hint: Any,
    max_pixels: Any,
    transform: Any,
    name: str = "transform",
    owner: str = "ImageFolder",
) -> MaxPixels:
    """Checks the decoding arguments early (in the main process); returns ``max_pixels``.

    A missing decoder fails here, naming the extra to install, not at the first sample.
    """
    check_choice("decode", decode, DECODE_CHOICES)
    if decode != "simplejpeg":
        require("PIL", owner, "to decode images")
    if size_hint != "full":
        check_size_hint(size_hint)
    if decode == "simplejpeg":
        _simplejpeg(required=True)  # a missing package fails here, not in a worker
    if transform is not None and not callable(transform):
        msg = f"{name} must be a callable or None, got {transform!r}"
        raise TypeError(msg)
    return check_max_pixels(max_pixels)


def decode_and_transform(
    data: Any,
    transform: Callable[[Any], Any] | None,
    *,
    decode: str = "auto",
    rgb: bool = True,
    size_hint: int | tuple[int, int] | str | None = None,
    max_pixels: MaxPixels = PILLOW_LIMIT,
    source: str | None = None,
) -> Any:
    """Decodes ``data`` as ImageFolder does (see its ``decode`` and ``size_hint``), then
    applies ``transform`` with one shared ``stoker.sample_rng()`` for its random steps."""
    to_pil = decode == "pil" or (decode == "auto" and _is_torchvision(transform))
    crop_step = None if to_pil or not rgb else region_decoded(transform)
    if crop_step is not None and (size_hint is None or size_hint == "full"):
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)

        def crop_first(raw: bytes) -> Any:
            image = decode_cropped(
                raw, crop_step, backend=decode, full_size=size_hint == "full",
                max_pixels=max_pixels, source=source,
            )  # fmt: skip
            return transform.apply_from(image, 1)  # type: ignore[union-attr]

        return call_with_shared_rng(crop_first, raw)
    image = decode_image(
        data,
        rgb=rgb,
        size_hint=_decode_size_hint(size_hint, transform),
        backend="pillow" if to_pil else decode,
        to_pil=to_pil,
        source=source,
        max_pixels=max_pixels,
    )
    if transform is not None:
        image = call_with_shared_rng(transform, image)
    return image


def _decode_size_hint(size_hint: Any, transform: Any) -> SizeHint:
    if size_hint == "full":
        return None
    if size_hint is not None:
        return size_hint  # type: ignore[no-any-return]
    hint = getattr(transform, "decode_size_hint", None)
    try:
        return check_size_hint(hint)
    except ValueError:
        return None  # a foreign attribute of that name: ignore it


def _is_torchvision(transform: Any) -> bool:
    """Whether ``transform`` is a torchvision object (those expect PIL images or tensors)."""
    return transform is not None and type(transform).__module__.startswith("torchvision.")


class DecodeImage:
    """A record transform: decode the record's image field, then apply ``transform`` to it.

    For datasets whose records hold encoded images (JPEG, PNG, ... bytes), such as the
    ``(image bytes, label)`` records of ``stoker pack``. The image is decoded exactly as
    :class:`~stoker.formats.image_folder.ImageFolder` decodes a file (same decoder, same
    reduced-size JPEG decoding, same random draws), so a packed copy of an image folder
    gives the same samples as the folder. The other fields pass through unchanged.

    Args:
        transform: any callable applied to the decoded image (a stoker.vision transform,
            a function, or a torchvision transform, which gets a ``PIL.Image``).
        field: which part of the record is the image: a position for tuple records, a key
            for dict records. ``None`` (default): position 0 of a tuple, ``"image"`` of a
            dict, and the whole record when it is bytes.
        decode, rgb, size_hint, max_pixels: as for ImageFolder.

    Example:
        >>> import io, tempfile
        >>> from PIL import Image
        >>> from stoker.formats.packed import PackedDataset, PackedWriter
        >>> from stoker.vision import DecodeImage, eval_transform
        >>> buffer = io.BytesIO()
        >>> Image.new("RGB", (80, 60), (10, 200, 30)).save(buffer, "JPEG")
        >>> folder = tempfile.mkdtemp()
        >>> with PackedWriter(folder, classes=["cat", "dog"]) as writer:
        ...     _ = writer.add((buffer.getvalue(), 1))
        >>> ds = PackedDataset(folder, transform=DecodeImage(eval_transform(32)))
        >>> image, label = ds[0]
        >>> image.shape, image.dtype, label
        ((3, 32, 32), dtype('float32'), 1)
    """

    def __init__(
        self,
        transform: Callable[[Any], Any] | None = None,
        *,
        field: int | str | None = None,
        decode: str = "auto",
        rgb: bool = True,
        size_hint: int | tuple[int, int] | str | None = None,
        max_pixels: MaxPixels = PILLOW_LIMIT,
    ) -> None:
        self.max_pixels = check_decode_options(
            decode, size_hint, max_pixels, transform, owner="DecodeImage"
        )
        if field is not None and not isinstance(field, (int, str)):
            msg = f"field must be None, a position (int) or a key (str), got {field!r}"
            raise TypeError(msg)
        self.transform = transform
        self.field = field
        self.decode = decode
        self.rgb = bool(rgb)
        self.size_hint = size_hint

    @property
    def thread_safe(self) -> bool:
        """Decoding keeps no state: thread-safe when ``transform`` is (see worker_mode)."""
        return self.transform is None or is_thread_safe(self.transform)

    def __call__(self, record: Any) -> Any:
        if isinstance(record, (bytes, bytearray, memoryview)) and self.field is None:
            return self._image(record)
        if isinstance(record, dict):
            key = "image" if self.field is None else self.field
            out = dict(record)
            out[key] = self._image(self._get(record, key))
            return out
        if isinstance(record, (tuple, list)):
            position = 0 if self.field is None else self.field
            out_list = list(record)
            out_list[position] = self._image(self._get(record, position))  # type: ignore[index]
            return tuple(out_list) if isinstance(record, tuple) else out_list
        msg = (
            f"DecodeImage expects a record holding encoded image bytes (bytes, a tuple or a "
            f"dict), got {type(record).__name__}"
        )
        raise TypeError(msg)

    def _get(self, record: Any, field: Any) -> Any:
        try:
            return record[field]
        except (KeyError, IndexError, TypeError):
            msg = f"DecodeImage(field={field!r}): the record has no such field: {_describe(record)}"
            raise KeyError(msg) from None

    def _image(self, data: Any) -> Any:
        return decode_and_transform(
            data,
            self.transform,
            decode=self.decode,
            rgb=self.rgb,
            size_hint=self.size_hint,
            max_pixels=self.max_pixels,
        )

    def __repr__(self) -> str:
        field = "" if self.field is None else f", field={self.field!r}"
        return f"DecodeImage({self.transform!r}{field})"


def _describe(record: Any) -> str:
    if isinstance(record, dict):
        return f"keys {sorted(map(str, record))}"
    return f"{type(record).__name__} of {len(record)}"
