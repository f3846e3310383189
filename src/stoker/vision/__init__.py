"""Image decoding and numpy transforms, so torchvision is not needed to train on images.

:func:`decode_image` turns encoded bytes into an ``(H, W, C)`` uint8 RGB array (libjpeg-turbo
through simplejpeg for JPEGs when installed, Pillow otherwise), decoding big JPEGs at 1/2,
1/4 or 1/8 scale when a ``size_hint`` says the caller needs less.

The transforms take and return ``(H, W, C)`` numpy arrays and compose like torchvision's:
:class:`Compose`, :class:`RandomResizedCrop`, :class:`RandomHorizontalFlip`,
:class:`Resize`, :class:`CenterCrop`, :class:`Normalize` and :class:`ToCHW` (alias
:data:`HWCToCHW`). :func:`train_transform` and :func:`eval_transform` build torchvision's
usual ImageNet recipes. Random transforms draw from :func:`stoker.sample_rng`, so the same
loader seed gives the same augmentations with any ``num_workers``.

:class:`DecodeImage` decodes the image field of a record and transforms it exactly as
``ImageFolder`` does a file, so packed images train like the folder they came from:
``PackedDataset("packed/train", transform=DecodeImage(train_transform(224)))``.

torchvision's own transforms still work: hand them to ``ImageFolder(transform=...)`` or
``DecodeImage(...)``, which give them a ``PIL.Image`` (see ``decode=`` there).

Example:
    >>> import numpy as np
    >>> from stoker.vision import eval_transform, train_transform
    >>> image = np.zeros((300, 400, 3), dtype=np.uint8)
    >>> eval_transform(224)(image).shape, train_transform(160)(image).dtype
    ((3, 224, 224), dtype('float32'))
"""

from __future__ import annotations

from stoker.vision.decode import ImageDecodeError, decode_image
from stoker.vision.records import DecodeImage
from stoker.vision.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    HWCToCHW,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToCHW,
    eval_transform,
    train_transform,
)

__all__ = [
    "CenterCrop",
    "Compose",
    "DecodeImage",
    "HWCToCHW",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDecodeError",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToCHW",
    "decode_image",
    "eval_transform",
    "train_transform",
]
