"""numpy transforms on ``(H, W, C)`` images that compose like torchvision's.

Random transforms draw from :func:`stoker.sample_rng`, so one loader seed gives the same
augmentations whatever ``num_workers`` is. ``sample_rng()`` restarts at the same point each
time it is called within one sample, so :class:`Compose` (and ``ImageFolder`` around its
whole ``transform``) fetch it once and share it with every random transform they call:
two random steps of one sample never make correlated draws.

Example:
    >>> import numpy as np
    >>> t = Compose([Resize(4), CenterCrop(4), Normalize((0.5,), (0.5,)), ToCHW()])
    >>> t(np.zeros((8, 12, 1), np.uint8)).shape
    (1, 4, 4)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from stoker._thread_safety import is_thread_safe
from stoker._validate import is_int
from stoker.seeding import sample_rng
from stoker.vision._resample import check_backend as _check_backend
from stoker.vision._resample import resize as _resize
from stoker.vision.decode import SizeHint

__all__ = [
    "CenterCrop",
    "Compose",
    "HWCToCHW",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToCHW",
    "call_with_shared_rng",
    "eval_transform",
    "train_transform",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# One generator per sample, shared by the random transforms called inside call_with_shared_rng.
_local = threading.local()
_PENDING = object()


def _rng() -> np.random.Generator:
    """The generator random transforms draw from: the shared one if a caller set it up."""
    shared = getattr(_local, "rng", None)
    if shared is None:
        return sample_rng()
    if shared is _PENDING:
        shared = _local.rng = sample_rng()
    return shared


def call_with_shared_rng(transform: Callable[[Any], Any], value: Any) -> Any:
    """Calls ``transform(value)``; the random transforms inside share one ``sample_rng()``."""
    if getattr(_local, "rng", None) is not None:
        return transform(value)
    _local.rng = _PENDING  # fetched on the first draw: deterministic pipelines pay nothing
    try:
        return transform(value)
    finally:
        _local.rng = None


# -- transforms ----------------------------------------------------------------------------


def _pair(size: Any, name: str) -> tuple[int, int]:
    if is_int(size) and size > 0:
        return int(size), int(size)
    if isinstance(size, (tuple, list)) and len(size) == 1:
        return _pair(size[0], name)
    if (
        isinstance(size, (tuple, list))
        and len(size) == 2
        and all(is_int(s) and s > 0 for s in size)
    ):
        return int(size[0]), int(size[1])
    msg = (
        f"{name} size must be a positive int or a (height, width) pair of positive ints, "
        f"got {size!r}"
    )
    raise ValueError(msg)


def _as_image(image: Any, who: str) -> np.ndarray:
    if isinstance(image, np.ndarray) and image.ndim in (2, 3):
        return image
    if (
        not isinstance(image, np.ndarray)
        and hasattr(image, "__array_interface__")
        and hasattr(image, "mode")
    ):
        return np.asarray(image)  # a PIL image
    shape = getattr(image, "shape", None)
    got = f"{type(image).__module__}.{type(image).__name__}" + (
        f" of shape {tuple(shape)}" if shape is not None else ""
    )
    msg = (
        f"{who} expects an (H, W, C) or (H, W) numpy array (or a PIL image), got {got}. "
        "stoker.vision transforms run on decoded images before any conversion to tensors or CHW."
    )
    raise TypeError(msg)


class Compose:
    """Applies transforms one after the other, sharing one random generator per sample.

    Args:
        transforms: callables, each taking and returning an image.

    Example:
        >>> import numpy as np
        >>> t = Compose([CenterCrop(2), ToCHW()])
        >>> t(np.zeros((4, 4, 3), np.uint8)).shape
        (3, 2, 2)
    """

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        transforms = list(transforms)
        for position, transform in enumerate(transforms):
            if not callable(transform):
                msg = (
                    f"Compose takes callables; transform {position} is {transform!r}, "
                    "which is not callable"
                )
                raise TypeError(msg)
        self.transforms = transforms
        self._fused: tuple[tuple[int, ...], int, Any] | None = None

    def __call__(self, image: Any) -> Any:
        return call_with_shared_rng(self.apply_from, image)

    def apply_from(self, image: Any, first: int = 0) -> Any:
        """Applies the steps from ``first`` on, the last ones fused into one pass where
        they can be (:mod:`stoker.vision.fused`: the same draws and values)."""
        steps = self.transforms
        start, tail = self._tail()
        if tail is None or first > start:
            start = len(steps)
        for transform in steps[first:start]:
            image = transform(image)
        if start == len(steps):
            return image
        if tail.applies_to(image):
            return tail(image)
        for transform in steps[start:]:
            image = transform(image)
        return image

    def _tail(self) -> tuple[int, Any]:
        """Where the fusable last steps start, and them fused (None); follows edits of
        :attr:`transforms`."""
        key = tuple(map(id, self.transforms))
        if self._fused is None or self._fused[0] != key:
            from stoker.vision.fused import split_tail

            self._fused = (key, *split_tail(self.transforms))
        return self._fused[1], self._fused[2]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fused = None  # ids mean nothing in another process

    def __iter__(self) -> Iterator[Callable[[Any], Any]]:
        return iter(self.transforms)

    @property
    def thread_safe(self) -> bool:
        """Thread-safe when every step declares it (see worker_mode)."""
        return all(map(is_thread_safe, self.transforms))

    def __len__(self) -> int:
        return len(self.transforms)

    @property
    def decode_size_hint(self) -> SizeHint:
        """The first resizing step's hint; None when a crop or unknown step comes first."""
        for transform in self.transforms:
            if getattr(transform, "keeps_size", False):
                continue
            hint: SizeHint = getattr(transform, "decode_size_hint", None)
            return hint
        return None

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{inner}\n])"


class Resize:
    """Resizes with antialiased bilinear resampling (like Pillow's and torchvision's).

    Args:
        size: an int (the shorter side becomes ``size``, keeping the aspect ratio) or
            ``(height, width)``.
        max_size: with an int ``size``, the longer side is capped at this.
        backend: ``"auto"`` (Pillow for uint8 images with 1 or 3 channels when installed,
            else numpy), ``"numpy"`` or ``"pillow"``. Both give the same filter; values
            differ by at most a few levels from rounding.

    Example:
        >>> import numpy as np
        >>> Resize(4)(np.zeros((8, 16, 3), np.uint8)).shape
        (4, 8, 3)
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    def __init__(
        self, size: int | tuple[int, int], max_size: int | None = None, *, backend: str = "auto"
    ) -> None:
        self.shorter = is_int(size) or (isinstance(size, (tuple, list)) and len(size) == 1)
        self.size = _pair(size, "Resize")
        if max_size is not None and (
            not self.shorter or not is_int(max_size) or max_size <= self.size[0]
        ):
            msg = (
                "max_size applies to an int size and must be an int larger than it, "
                f"got size={size!r}, max_size={max_size!r}"
            )
            raise ValueError(msg)
        self.max_size = None if max_size is None else int(max_size)
        self.backend = _check_backend(backend)

    @property
    def decode_size_hint(self) -> SizeHint:
        return self.size[0] if self.shorter else self.size

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` an image of this size is resized to (torchvision's rule)."""
        if not self.shorter:
            return self.size
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.size[0], int(self.size[0] * long / short)
        if self.max_size is not None and new_long > self.max_size:
            new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "Resize")
        target = self.output_size(*image.shape[:2])
        if target == image.shape[:2]:
            return image
        return _resize(image, target, None, self.backend)

    def __repr__(self) -> str:
        size = self.size[0] if self.shorter else self.size
        return f"Resize(size={size!r}, max_size={self.max_size!r})"


class CenterCrop:
    """Crops the centre (torchvision's rounding); pads with zeros if the image is smaller.

    Example:
        >>> import numpy as np
        >>> CenterCrop((2, 3))(np.arange(25).reshape(5, 5))
        array([[11, 12, 13],
               [16, 17, 18]])
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    def __init__(self, size: int | tuple[int, int]) -> None:
        self.size = _pair(size, "CenterCrop")

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "CenterCrop")
        crop_h, crop_w = self.size
        height, width = image.shape[:2]
        if crop_h > height or crop_w > width:
            pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
            pads = [(pad_h // 2, (pad_h + 1) // 2), (pad_w // 2, (pad_w + 1) // 2)] + [(0, 0)] * (
                image.ndim - 2
            )
            image = np.pad(image, pads)
            height, width = image.shape[:2]
        top, left = round((height - crop_h) / 2.0), round((width - crop_w) / 2.0)
        return image[top : top + crop_h, left : left + crop_w]

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size!r})"


class RandomResizedCrop:
    """Crops a random area and aspect ratio, then resizes it to ``size`` (torchvision's algorithm).

    The crop covers ``scale`` of the image area with an aspect ratio drawn log-uniformly
    from ``ratio``; after ten misses it falls back to a centre crop. Draws come from
    :func:`stoker.sample_rng`.

    Args:
        size: output ``(height, width)``, or an int for a square.
        scale: range of the crop's share of the image area.
        ratio: range of the crop's width / height.
        backend: as for :class:`Resize`.

    Example:
        >>> import numpy as np
        >>> RandomResizedCrop(32)(np.zeros((100, 80, 3), np.uint8)).shape
        (32, 32, 3)
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        *,
        backend: str = "auto",
    ) -> None:
        self.size = _pair(size, "RandomResizedCrop")
        for name, pair in (("scale", scale), ("ratio", ratio)):
            ok = (
                isinstance(pair, (tuple, list))
                and len(pair) == 2
                and all(isinstance(v, (int, float)) for v in pair)
            )
            if not ok or not 0 < pair[0] <= pair[1]:
                msg = (
                    f"RandomResizedCrop {name} must be a (min, max) pair with 0 < min <= max, "
                    f"got {pair!r}"
                )
                raise ValueError(msg)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.backend = _check_backend(backend)

    decode_size_hint = None  # the crop may be small: decode at full size

    def get_params(
        self, height: int, width: int, rng: np.random.Generator
    ) -> tuple[int, int, int, int]:
        """Draws a crop ``(top, left, height, width)`` inside a ``height x width`` image."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                return (
                    int(rng.integers(0, height - h + 1)),
                    int(rng.integers(0, width - w + 1)),
                    h,
                    w,
                )
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, max(1, round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, max(1, round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "RandomResizedCrop")
        top, left, h, w = self.get_params(image.shape[0], image.shape[1], _rng())
        return _resize(image, self.size, (top, left, h, w), self.backend)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size!r}, scale={self.scale!r}, ratio={self.ratio!r})"


class RandomHorizontalFlip:
    """Mirrors the image left-right with probability ``p`` (draws from :func:`stoker.sample_rng`).

    Example:
        >>> import numpy as np
        >>> RandomHorizontalFlip(p=1.0)(np.array([[1, 2, 3]]))
        array([[3, 2, 1]])
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    keeps_size = True

    def __init__(self, p: float = 0.5) -> None:
        if not (is_int(p) or isinstance(p, (float, np.floating))) or not 0.0 <= p <= 1.0:
            msg = f"RandomHorizontalFlip p must be a probability in [0, 1], got {p!r}"
            raise ValueError(msg)
        self.p = float(p)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "RandomHorizontalFlip")
        if _rng().random() < self.p:
            return np.ascontiguousarray(
                image[:, ::-1]
            )  # no negative strides: torch.from_numpy refuses them
        return image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Normalize:
    """``(image * scale - mean) / std`` per channel, as float32 (channels last).

    Args:
        mean: one value per channel.
        std: one non-zero value per channel.
        scale: multiply by 1/255 first? ``None`` (default) does so for uint8 images, like
            torchvision's ``ToTensor`` then ``Normalize``; ``True`` always, ``False`` never
            (give ``mean`` and ``std`` in 0-255 units then).

    Example:
        >>> import numpy as np
        >>> Normalize(mean=(0.5,), std=(0.5,))(np.array([[[0], [255]]], np.uint8)).ravel()
        array([-1.,  1.], dtype=float32)
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    keeps_size = True

    def __init__(
        self, mean: Sequence[float], std: Sequence[float], *, scale: bool | None = None
    ) -> None:
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.std = np.asarray(std, dtype=np.float64).reshape(-1)
        if len(self.mean) != len(self.std) or len(self.mean) == 0:
            msg = (
                "Normalize mean and std need one value per channel each, "
                f"got mean={mean!r}, std={std!r}"
            )
            raise ValueError(msg)
        if np.any(self.std == 0):
            msg = f"Normalize std must be non-zero (it divides), got std={std!r}"
            raise ValueError(msg)
        if scale not in (None, True, False):
            msg = f"Normalize scale must be None (by dtype), True or False, got {scale!r}"
            raise ValueError(msg)
        self.scale = scale

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "Normalize")
        channels = image.shape[-1] if image.ndim == 3 else 1
        if channels != len(self.mean) and len(self.mean) != 1:
            msg = (
                f"Normalize has {len(self.mean)} channel means but the image has shape "
                f"{image.shape}: {channels} channels last. Normalize runs on (H, W, C) images; "
                "put it before ToCHW."
            )
            raise ValueError(msg)
        factor = (
            (1.0 / 255.0)
            if (self.scale or (self.scale is None and image.dtype == np.uint8))
            else 1.0
        )
        multiply = (factor / self.std).astype(np.float32)
        add = (-self.mean / self.std).astype(np.float32)
        if image.ndim == 2:
            multiply, add = multiply[0], add[0]
        out = image.astype(np.float32)
        out *= multiply
        out += add
        return out

    def __repr__(self) -> str:
        return (
            f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()}, scale={self.scale!r})"
        )


class ToCHW:
    """``(H, W, C)`` to a contiguous ``(C, H, W)`` (``(H, W)`` becomes ``(1, H, W)``).

    Example:
        >>> import numpy as np
        >>> ToCHW()(np.zeros((4, 5, 3))).shape
        (3, 4, 5)
    """

    thread_safe = True  # no state between calls; draws come from the sample's generator

    keeps_size = True

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _as_image(image, "ToCHW")
        if image.ndim == 2:
            return np.ascontiguousarray(image[None])
        return np.ascontiguousarray(image.transpose(2, 0, 1))

    def __repr__(self) -> str:
        return "ToCHW()"


HWCToCHW = ToCHW


def train_transform(
    size: int | tuple[int, int] = 224,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    flip: float = 0.5,
    chw: bool = True,
    normalize: bool = True,
    backend: str = "auto",
) -> Compose:
    """torchvision's ImageNet training recipe: random resized crop, flip, normalise, CHW.

    ``normalize=False`` leaves the images uint8 (CHW with ``chw``): a quarter of the bytes
    through shared memory, pinned memory and the copy to the accelerator. Normalise them
    there with ``stoker.torch.Normalize(mean, std)``, which gives the same float32 values
    as this recipe's ``Normalize`` step, bit for bit on the CPU.

    Example:
        >>> train_transform(224)
        Compose([
            RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333)),
            RandomHorizontalFlip(p=0.5),
            Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], scale=None),
            ToCHW(),
        ])
    """
    steps: list[Callable[[Any], Any]] = [RandomResizedCrop(size, scale, ratio, backend=backend)]
    if flip > 0:
        steps.append(RandomHorizontalFlip(flip))
    if normalize:
        steps.append(Normalize(mean, std))
    if chw:
        steps.append(ToCHW())
    return Compose(steps)


def eval_transform(
    size: int | tuple[int, int] = 224,
    resize: int | None = None,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    *,
    chw: bool = True,
    normalize: bool = True,
    backend: str = "auto",
) -> Compose:
    """torchvision's ImageNet evaluation recipe: resize, centre crop, normalise, CHW.

    Args:
        size: the crop.
        resize: the shorter side before cropping; default ``size / 0.875`` (256 for 224).
        normalize: ``False`` leaves the images uint8, to be normalised on the accelerator
            with ``stoker.torch.Normalize`` (see :func:`train_transform`).

    Example:
        >>> eval_transform(224).transforms[:2]
        [Resize(size=256, max_size=None), CenterCrop(size=(224, 224))]
    """
    crop = _pair(size, "eval_transform")
    if resize is None:
        resize = int(min(crop) / 0.875)
    steps: list[Callable[[Any], Any]] = [
        Resize(resize, backend=backend),
        CenterCrop(crop),
    ]
    if normalize:
        steps.append(Normalize(mean, std))
    if chw:
        steps.append(ToCHW())
    return Compose(steps)
