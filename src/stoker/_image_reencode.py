"""Shrinking and re-encoding images as ``stoker pack --max-side/--quality`` does.

:class:`Reencode` turns the bytes of one JPEG or PNG file into the bytes to store:

* with ``max_side``: an image whose longer side exceeds it is turned upright (its EXIF
  orientation applied, ``ImageOps.exif_transpose``), converted to RGB unless it is RGB or
  L (RGBA and LA lose their alpha, palette and CMYK images are converted), resized with
  Pillow's LANCZOS filter so that its longer side is ``max_side`` (aspect kept), and
  encoded as JPEG at ``quality``; a smaller image is kept as it is, byte for byte;
* with ``quality`` alone: every JPEG is turned upright, converted the same way and
  encoded again at ``quality`` (same size); PNGs are kept.

Files that are neither JPEG nor PNG (by their first bytes, or by their name when the
bytes are not an image) are kept as they are. A file that is named or looks like a JPEG
or PNG but cannot be read as an image raises what Pillow raises; the caller reports it.
The work runs in the caller's threads (Pillow releases the GIL while it decodes, resizes
and encodes).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["DEFAULT_QUALITY", "Reencode"]

DEFAULT_QUALITY = 90  # --max-side without --quality
_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_IMAGE_NAMES = (".jpg", ".jpeg", ".png")
_KEPT_MODES = ("RGB", "L")


def _kind(data: bytes, name: str) -> str | None:
    """ "JPEG", "PNG", "image?" (named like one, but not one by its bytes) or None."""
    if data.startswith(_JPEG_MAGIC):
        return "JPEG"
    if data.startswith(_PNG_MAGIC):
        return "PNG"
    return "image?" if os.path.splitext(name)[1].lower() in _IMAGE_NAMES else None


@dataclass(frozen=True, slots=True)
class Reencode:
    """What to do with each image: ``max_side`` (None: no resizing) and JPEG ``quality``;
    ``every_jpeg``: re-encode JPEGs that are not resized too (``--quality`` alone)."""

    max_side: int | None
    quality: int
    every_jpeg: bool

    @classmethod
    def from_options(cls, max_side: int | None, quality: int | None) -> Reencode | None:
        """The work ``--max-side`` and ``--quality`` ask for, or None when neither is given."""
        if max_side is None and quality is None:
            return None
        return cls(max_side, DEFAULT_QUALITY if quality is None else quality, max_side is None)

    def describe(self) -> dict[str, int | None]:
        """The options, as the manifest's metadata records them."""
        return {"max_side": self.max_side, "quality": self.quality}

    def __call__(self, data: bytes, name: str) -> bytes | None:
        """The bytes to store instead of ``data``, or None to store ``data`` itself."""
        kind = _kind(data, name)
        if kind is None:
            return None
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:  # raises for a file that is no image
            if image.format not in ("JPEG", "PNG"):
                return None
            too_large = self.max_side is not None and max(image.size) > self.max_side
            if not too_large and not (self.every_jpeg and image.format == "JPEG"):
                return None
            return self._encode(image)

    def _encode(self, image: PILImage) -> bytes:
        from PIL import Image, ImageOps

        icc = image.info.get("icc_profile") if image.mode in _KEPT_MODES else None
        image.load()  # a truncated or damaged file raises here
        upright = ImageOps.exif_transpose(image)
        if upright.mode not in _KEPT_MODES:
            upright = upright.convert("RGB")
        if self.max_side is not None and max(upright.size) > self.max_side:
            width, height = upright.size
            scale = self.max_side / max(width, height)
            size = (
                (self.max_side, max(1, round(height * scale)))
                if width >= height
                else (max(1, round(width * scale)), self.max_side)
            )
            upright = upright.resize(size, Image.Resampling.LANCZOS)
        out = io.BytesIO()
        extra = {"icc_profile": icc} if icc else {}
        upright.save(out, format="JPEG", quality=self.quality, **extra)
        return out.getvalue()
