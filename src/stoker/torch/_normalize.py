"""Normalising uint8 image batches where the model runs: ``stoker.torch.Normalize``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from stoker.vision.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["Normalize"]


class Normalize(torch.nn.Module):
    """``(batch * scale - mean) / std`` per channel, as float32, on the batch's device.

    The device-side half of a recipe built with ``normalize=False``
    (``stoker.vision.train_transform(224, normalize=False)`` hands uint8 CHW images, a
    quarter of the bytes of float32 through shared memory, pinned memory and the copy to
    the accelerator). Its values are those of ``stoker.vision.Normalize`` (the same
    float32 multiplier and addend, applied as the same two roundings), so on the CPU the
    batches equal the float recipe's bit for bit; on an accelerator they agree to float32
    rounding. Move it with the model (``.to(device)``); its two constants are buffers.

    Args:
        mean, std: one value per channel (ImageNet's by default).
        scale: multiply by 1/255 first? ``None`` (default) does so for uint8 batches, as
            the CPU step does; ``True`` always, ``False`` never.
        channels_last: the channels are the last axis (``chw=False`` recipes) rather than
            the third from last (CHW, batched or not).

    Example:
        >>> import torch
        >>> normalize = Normalize(mean=(0.5,), std=(0.5,))
        >>> normalize(torch.tensor([[[[0, 255]]]], dtype=torch.uint8))
        tensor([[[[-1.,  1.]]]])
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        *,
        scale: bool | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        mean64 = np.asarray(mean, dtype=np.float64).reshape(-1)
        std64 = np.asarray(std, dtype=np.float64).reshape(-1)
        if len(mean64) != len(std64) or len(mean64) == 0:
            msg = (
                "stoker.torch.Normalize mean and std need one value per channel each, "
                f"got mean={mean!r}, std={std!r}"
            )
            raise ValueError(msg)
        if np.any(std64 == 0):
            msg = f"stoker.torch.Normalize std must be non-zero (it divides), got std={std!r}"
            raise ValueError(msg)
        if scale not in (None, True, False):
            msg = f"stoker.torch.Normalize scale must be None, True or False, got {scale!r}"
            raise ValueError(msg)
        self.scale = scale
        self.channels_last = channels_last
        self.mean, self.std = tuple(mean64.tolist()), tuple(std64.tolist())
        shape = (-1,) if channels_last else (-1, 1, 1)
        # the CPU step's constants, computed the same way (float64, then float32)
        for name, values in (
            ("multiply_scaled", (1.0 / 255.0) / std64),
            ("multiply", 1.0 / std64),
            ("add", -mean64 / std64),
        ):
            tensor = torch.from_numpy(values.astype(np.float32)).reshape(shape)
            self.register_buffer(name, tensor, persistent=False)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        axis = -1 if self.channels_last else -3
        channels = self.add.shape[0]
        if batch.ndim < -axis or (channels != 1 and batch.shape[axis] != channels):
            layout = "(..., H, W, C)" if self.channels_last else "(..., C, H, W)"
            msg = (
                f"stoker.torch.Normalize has {channels} channel means but got a batch of shape "
                f"{tuple(batch.shape)}; it normalises {layout} batches"
                + ("" if self.channels_last else " (channels_last=True for HWC images)")
            )
            raise ValueError(msg)
        scaled = self.scale or (self.scale is None and batch.dtype == torch.uint8)
        multiply = self.multiply_scaled if scaled else self.multiply
        out = batch.to(torch.float32, copy=True)  # never the caller's tensor, changed in place
        return out.mul_(multiply).add_(self.add)

    def extra_repr(self) -> str:
        return f"mean={list(self.mean)}, std={list(self.std)}"
