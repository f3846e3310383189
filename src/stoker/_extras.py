"""Optional packages, and the extra that installs each: :func:`require` names it when missing.

stoker's core needs numpy alone. Decoding images, the ``stoker.torch`` loader, progress
bars and plots need packages that come with an extra (``pip install 'stoker[image]'``);
:func:`require` imports one, or raises :class:`MissingExtraError` saying what needs it
and which extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from stoker._errors import MissingExtraError

__all__ = ["EXTRAS", "MissingExtraError", "require"]

# module -> (the package pip installs, the stoker extra that brings it)
EXTRAS = {
    "PIL": ("Pillow", "image"),
    "simplejpeg": ("simplejpeg", "image"),
    "torch": ("torch", "torch"),
    "tqdm": ("tqdm", "cli"),
    "matplotlib": ("matplotlib", "cli"),
    "fsspec": ("fsspec", "storage"),
    "s3fs": ("s3fs", "storage"),
    "aiohttp": ("aiohttp", "storage"),  # fsspec's HTTP file system; s3fs brings it
    "ray": ("ray", "ray"),
}


def install_hint(module: str) -> str:
    """``pip install 'stoker[EXTRA]'`` for the extra that brings ``module``."""
    return f"pip install 'stoker[{EXTRAS[module][1]}]'"


def require(module: str, who: str, why: str = "") -> ModuleType:
    """Imports ``module``, or raises :class:`MissingExtraError` naming the extra to install.

    Args:
        module: a key of :data:`EXTRAS` (``"PIL"``, ``"torch"``, ...).
        who: what needs it, as the message starts (``"stoker doctor"``).
        why: what for, or "" (``"to decode images"``).

    Example:
        >>> require("PIL", "stoker doctor", "to decode images").__name__
        'PIL'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = EXTRAS[module][0]
        purpose = f" {why}" if why else ""
        message = f"{who} needs {package}{purpose}: {install_hint(module)}"
        raise MissingExtraError(message, name=module) from exc
