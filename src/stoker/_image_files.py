"""Is this file an image? The check ``stoker pack`` runs on every file, and ``stoker doctor`` too.

:func:`read_image_file` reads a file and checks it with Pillow; it returns the bytes, or
None and the reason (unreadable, empty, corrupt). The checks:

* ``"decode"``: a full decode at reduced scale (JPEGs at 1/8 of their size), which
  catches truncated files and files that are not images at all;
* ``"verify"``: Pillow's ``verify()``, headers and structure only (faster; it misses a
  truncated JPEG);
* ``"none"``: the file is read, not checked.

Pillow comes with the ``image`` extra; the callers check that it is installed.
"""

from __future__ import annotations

import io
import re

__all__ = ["IMAGE_CHECKS", "check_image", "pillow_reason", "read_image_file"]

IMAGE_CHECKS = ("decode", "verify", "none")
# how Pillow names the in-memory file it was given: "<_io.BytesIO object at 0x7f...>"
_BUFFER_REPR = re.compile(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def pillow_reason(exc: BaseException, name: str) -> str:
    """``TypeName: message`` of what Pillow raised, with ``name`` (the file) where Pillow's
    message shows the in-memory buffer it read (``cannot identify image file <_io.BytesIO
    object at 0x...>``)."""
    return f"{type(exc).__name__}: {_BUFFER_REPR.sub(lambda _: name, str(exc))}"


def check_image(data: bytes, mode: str) -> None:
    """Raises what Pillow raises when ``data`` is not a readable image (``mode``: see above)."""
    if mode == "none":
        return
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if mode == "verify":
            image.verify()
            return
        if image.format == "JPEG":
            image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()


def read_image_file(path: str, mode: str) -> tuple[bytes | None, str | None]:
    """The file's bytes and None, or None and why it is not a usable image."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    if not data:
        return None, "empty file"
    try:
        check_image(data, mode)
    except Exception as exc:  # Pillow raises many types for bad images
        return None, f"corrupt image: {pillow_reason(exc, repr(path))}"
    return data, None
