"""Decoding encoded images to ``(H, W, C)`` uint8 numpy arrays, at reduced scale when asked.

JPEGs go through libjpeg-turbo (`simplejpeg`_) when it is installed, everything else (and
JPEGs without simplejpeg, and CMYK JPEGs) through Pillow. Both decoders use the same
libjpeg-turbo scaling, so a ``size_hint`` gives the same reduced shape either way.

An image's header states its size, and a few hundred bytes can claim 60000 x 60000 pixels
(10 GB once decoded). The size is checked against a pixel limit (``max_pixels``, by default
Pillow's ``PIL.Image.MAX_IMAGE_PIXELS``, about 89 million) before anything is decoded,
whichever decoder would run.

Example:
    >>> import io
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (800, 600)).save(buffer, "JPEG")
    >>> decode_image(buffer.getvalue(), size_hint=256).shape
    (300, 400, 3)

.. _simplejpeg: https://gitlab.com/jfolz/simplejpeg
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from stoker._errors import ImageDecodeError
from stoker._image_files import pillow_reason
from stoker._printable import printable
from stoker._validate import check_choice, is_int

__all__ = [
    "ImageDecodeError",
    "SizeHint",
    "check_max_pixels",
    "check_size_hint",
    "decode_image",
    "reduction_factor",
]

SizeHint = int | tuple[int, int] | None
MaxPixels = int | str | None
# max_pixels="pillow": Pillow's PIL.Image.MAX_IMAGE_PIXELS when it is decoded (users raise or
# lower that one setting for every decoder), or Pillow's own default where Pillow is missing.
PILLOW_LIMIT = "pillow"
_PILLOW_DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3
_BACKENDS = ("auto", "simplejpeg", "pillow")
_JPEG_MAGIC = b"\xff\xd8\xff"
_SIMPLEJPEG_COLORSPACES = ("YCbCr", "Gray")  # CMYK and YCCK go to Pillow, like torchvision


class _TooManyPixels(Exception):
    """An image's header declares more pixels than the limit."""

    def __init__(self, height: int, width: int, limit: int) -> None:
        super().__init__(
            f"its header declares {width} x {height} pixels ({width * height:,}), more than the "
            f"limit of {limit:,} (max_pixels, by default Pillow's PIL.Image.MAX_IMAGE_PIXELS), "
            "so it was not decoded: it may be a decompression bomb. Raise the limit if the "
            "image is genuine, or remove the file"
        )


# -- decoding ------------------------------------------------------------------------


def decode_image(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    rgb: bool = True,
    size_hint: SizeHint = None,
    backend: str = "auto",
    to_pil: bool = False,
    source: str | None = None,
    max_pixels: MaxPixels = PILLOW_LIMIT,
) -> Any:
    """Decodes an encoded image (JPEG, PNG, BMP, WebP, ...) to an ``(H, W, C)`` uint8 array.

    Args:
        data: the file's bytes.
        rgb: convert to 3-channel RGB (grayscale, RGBA, palette, CMYK all become RGB; alpha
            is dropped, as torchvision's loader does). With ``False`` the image keeps one
            (grayscale), three (RGB) or four (RGBA) channels.
        size_hint: the smallest size the caller needs: an int (the shorter side) or
            ``(height, width)``. A JPEG is then decoded at 1/2, 1/4 or 1/8 scale when the
            reduced image is still at least that large. ``None`` decodes at full size.
        backend: ``"auto"`` (simplejpeg for JPEGs when installed, else Pillow),
            ``"simplejpeg"`` (require it for JPEGs) or ``"pillow"``.
        to_pil: return a ``PIL.Image.Image`` instead of an array (decoded by Pillow), for
            transforms that expect one, such as torchvision's.
        source: where the bytes came from (a file path), named in errors.
        max_pixels: refuse an image whose header declares more pixels than this, before
            decoding it: ``"pillow"`` (default) reads Pillow's ``PIL.Image.MAX_IMAGE_PIXELS``
            at each call, an int sets the limit, ``None`` removes it. Pillow keeps its own
            check too, so to decode larger non-JPEG images raise Pillow's setting.

    Raises:
        ImageDecodeError: the bytes are not a readable image (corrupt, truncated, unknown),
            or declare more pixels than ``max_pixels``.

    Example:
        >>> import io, numpy as np
        >>> from PIL import Image
        >>> buffer = io.BytesIO()
        >>> Image.new("L", (64, 48), 200).save(buffer, "JPEG")
        >>> decode_image(buffer.getvalue(), size_hint=20).shape
        (24, 32, 3)
    """
    check_choice("backend", backend, _BACKENDS)
    check_size_hint(size_hint)
    limit = pixel_limit(max_pixels)
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    try:
        if raw[:3] == _JPEG_MAGIC and not to_pil and backend != "pillow":
            simplejpeg = _simplejpeg(required=backend == "simplejpeg")
            if simplejpeg is not None:
                try:
                    image = _decode_simplejpeg(simplejpeg, raw, rgb, size_hint, limit)
                except _TooManyPixels:
                    raise
                except Exception:
                    pass
                else:
                    if image is not None:
                        return image
        return _decode_pillow(raw, rgb, size_hint, to_pil, limit)
    except ImportError:
        raise
    except Exception as exc:
        where = printable(source) if source is not None else f"an image of {len(raw)} bytes"
        named = repr(source) if source is not None else f"(an image of {len(raw)} bytes)"
        reason = str(exc) if isinstance(exc, _TooManyPixels) else pillow_reason(exc, named)
        if isinstance(exc, _TooManyPixels):
            msg = f"cannot decode {where}: {reason}."
        else:
            msg = (
                f"cannot decode {where}: {reason}. The file is corrupt, "
                "truncated or not an image; re-encode or remove it, or pass on_error='skip' to "
                "the DataLoader to leave bad files out."
            )
        error = ImageDecodeError(msg)
        error.filename = source  # type: ignore[attr-defined]
        error.reason = reason  # type: ignore[attr-defined]
        raise error from exc


def check_max_pixels(max_pixels: Any) -> MaxPixels:
    """Returns ``max_pixels`` if it is ``"pillow"``, None or a positive int; raises otherwise."""
    if max_pixels is None or max_pixels == PILLOW_LIMIT:
        return max_pixels  # type: ignore[no-any-return]
    if is_int(max_pixels) and max_pixels > 0:
        return int(max_pixels)
    msg = (
        "max_pixels must be 'pillow' (Pillow's PIL.Image.MAX_IMAGE_PIXELS), a positive int or "
        f"None (no limit), got {max_pixels!r}"
    )
    raise ValueError(msg)


def pixel_limit(max_pixels: MaxPixels) -> int | None:
    """The limit ``max_pixels`` stands for now (``"pillow"`` is read at each call)."""
    max_pixels = check_max_pixels(max_pixels)
    if max_pixels != PILLOW_LIMIT:
        return max_pixels  # type: ignore[return-value]
    try:
        from PIL import Image
    except ImportError:
        return _PILLOW_DEFAULT_MAX_PIXELS
    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is None else int(limit)


def _check_pixels(height: int, width: int, limit: int | None) -> None:
    if limit is not None and height * width > limit:
        raise _TooManyPixels(height, width, limit)


def check_size_hint(size_hint: Any) -> SizeHint:
    """Returns ``size_hint`` if it is None, a positive int or a pair of them; raises otherwise."""
    if size_hint is None:
        return None
    if is_int(size_hint) and size_hint > 0:
        return int(size_hint)
    if (
        isinstance(size_hint, (tuple, list))
        and len(size_hint) == 2
        and all(is_int(s) and s > 0 for s in size_hint)
    ):
        return int(size_hint[0]), int(size_hint[1])
    msg = (
        f"size_hint must be None, a positive int (the shorter side) or a (height, width) pair "
        f"of positive ints, got {size_hint!r}"
    )
    raise ValueError(msg)


def reduction_factor(height: int, width: int, size_hint: SizeHint) -> int:
    """The largest of 8, 4, 2, 1 that keeps a ``height x width`` image at least ``size_hint``.

    The reduced image is ``ceil(height / f) x ceil(width / f)``, as libjpeg decodes it.
    """
    if size_hint is None:
        return 1
    for factor in (8, 4, 2):
        if height < factor or width < factor:
            continue
        h, w = -(-height // factor), -(-width // factor)
        fits = (
            min(h, w) >= size_hint
            if isinstance(size_hint, int)
            else (h >= size_hint[0] and w >= size_hint[1])
        )
        if fits:
            return factor
    return 1


_simplejpeg_module: Any = None


def _simplejpeg(*, required: bool) -> Any:
    global _simplejpeg_module
    if _simplejpeg_module is None:
        try:
            import simplejpeg  # type: ignore[import-untyped]
        except ImportError:
            if required:
                msg = (
                    "backend='simplejpeg' needs the simplejpeg package: pip install simplejpeg "
                    "(or pip install 'stoker[image]'), or use backend='auto' to fall back to Pillow"
                )
                raise ImportError(msg) from None
            _simplejpeg_module = False
        else:
            _simplejpeg_module = simplejpeg
    return _simplejpeg_module or None


def _decode_simplejpeg(
    simplejpeg: Any, raw: bytes, rgb: bool, size_hint: SizeHint, limit: int | None
) -> np.ndarray | None:
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    _check_pixels(height, width, limit)
    if colorspace not in _SIMPLEJPEG_COLORSPACES:
        return None
    factor = reduction_factor(height, width, size_hint)
    # ceil(size / factor) makes libjpeg pick exactly 1/factor: any smaller scale is too small.
    min_height, min_width = (-(-height // factor), -(-width // factor)) if factor > 1 else (0, 0)
    target = "GRAY" if colorspace == "Gray" and not rgb else "RGB"
    image: np.ndarray = simplejpeg.decode_jpeg(
        raw, colorspace=target, min_height=min_height, min_width=min_width
    )
    return image


def _decode_pillow(
    raw: bytes, rgb: bool, size_hint: SizeHint, to_pil: bool, limit: int | None
) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(raw))  # reads the header only
    _check_pixels(image.height, image.width, limit)
    if size_hint is not None and image.format == "JPEG":
        width, height = image.size
        factor = reduction_factor(height, width, size_hint)
        if factor > 1:  # Pillow reduces by the largest power of two within size // request
            image.draft(image.mode, (width // factor, height // factor))
    image.load()
    image = _to_standard_mode(image, rgb)
    if to_pil:
        return image
    array = np.array(image)  # a writable copy, like simplejpeg's output
    return array[:, :, None] if array.ndim == 2 else array


def _to_standard_mode(image: Any, rgb: bool) -> Any:
    """L, RGB or RGBA (RGB only when ``rgb``); 16-bit grayscale is scaled, not clipped."""
    from PIL import Image

    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        wide = np.clip(np.asarray(image, dtype=np.int64), 0, 65535)
        image = Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), "L")
        mode = "L"
    elif mode == "PA" or (mode == "P" and "transparency" in image.info):
        image, mode = image.convert("RGBA"), "RGBA"
    target = (
        "RGB"
        if rgb
        else {"L": "L", "1": "L", "RGB": "RGB", "RGBA": "RGBA", "LA": "RGBA"}.get(mode, "RGB")
    )
    return image if mode == target else image.convert(target)
