"""An allocator for collate_into that the collate tests share."""

from __future__ import annotations

import numpy as np


class Pool:
    """Hands out aligned views of one big byte buffer, recording each."""

    def __init__(self, nbytes=1 << 16):
        self.buffer = np.zeros(nbytes, np.uint8)
        self.offset = 0
        self.handed = []

    def __call__(self, shape, dtype):
        assert isinstance(shape, tuple) and isinstance(dtype, np.dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self.offset // 64) * 64
        view = self.buffer[start : start + n].view(dtype).reshape(shape)
        self.offset = start + n
        self.handed.append(view)
        return view
