"""``RaggedCollate``: variable-count fields (detection boxes) concatenated, with a batch index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from stoker._errors import CollateError
from stoker.collate._fields import (
    _as_arrays,
    _assemble,
    _check_key,
    _check_other_dims,
    _key_list,
    _seg,
    _split_samples,
    _to_output,
)
from stoker.collate._registry import (
    _at,
    _empty,
    _field,
    _finish,
    _format_path,
    _torch,
    _torch_alloc,
    collate,
    default_collate_fn_map,
)

__all__ = ["RaggedCollate"]

# --------------------------------------------------------------------- RaggedCollate


@dataclass(frozen=True, slots=True)
class RaggedCollate:
    """Concatenates variable-count fields (detection boxes) and adds a batch index.

    Each field in ``fields`` holds, per sample, ``N_i`` rows: an array or tensor of
    shape ``(N_i, ...)`` or a list (``[]`` or ``np.array([])`` for none). The fields of
    one sample must agree on ``N_i``; ``N_i = 0`` is fine (a field that is empty in every
    sample and has no array to take a dtype from comes out as int64 of shape ``(0,)``).
    They are concatenated along axis 0 to shape ``(sum N_i, ...)``, and the batch index
    (which sample each row came from) is added: as an int64 array of shape
    ``(sum N_i,)`` under ``batch_index_key`` (the ultralytics ``batch_idx`` style),
    and/or as an extra first column of the 2-D fields named in ``prepend_batch_index``
    (YOLOv5's ``targets`` layout; the index is cast to the field's dtype). Other fields
    go through :func:`default_collate`.

    Output: for dict samples a dict with the sample's keys, then ``batch_index_key``
    and ``counts_key``; for tuple samples (``fields`` are positions) a list followed by
    the batch index and counts. A namedtuple sample is treated as a dict. The batch
    index and counts are tensors when the first field holds tensors.

    Args:
        fields: the variable-count fields (dict keys or tuple positions).
        batch_index_key: where to put the batch index, or ``None``.
        prepend_batch_index: 2-D fields that get the batch index as column 0.
        counts_key: where to put ``N_i`` per sample (int64, shape ``(batch,)``), or
            ``None``.

    Example:
        >>> collate_fn = RaggedCollate(fields=("boxes", "labels"))
        >>> batch = collate_fn([
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.ones((2, 4)), "labels": [1, 2]},
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.zeros((0, 4)), "labels": []},
        ...     {"image": np.zeros((3, 4, 4)), "boxes": np.ones((1, 4)), "labels": [3]},
        ... ])
        >>> batch["image"].shape, batch["boxes"].shape, batch["batch_index"].tolist()
        ((3, 3, 4, 4), (3, 4), [0, 0, 2])
    """

    fields: Sequence[Any]
    _: KW_ONLY
    batch_index_key: Any = "batch_index"
    prepend_batch_index: Sequence[Any] = ()
    counts_key: Any = None

    def __post_init__(self) -> None:
        fields = _key_list("fields", self.fields, allow_none=False)
        if not fields:
            msg = "fields must name at least one variable-count field, got []"
            raise ValueError(msg)
        object.__setattr__(self, "fields", fields)
        prepend = _key_list("prepend_batch_index", self.prepend_batch_index, allow_none=False)
        object.__setattr__(self, "prepend_batch_index", prepend)
        for k in prepend or ():
            if k not in fields:
                msg = f"prepend_batch_index names {k!r}, which is not in fields={list(fields)}"
                raise ValueError(msg)
        _check_key("batch_index_key", self.batch_index_key)
        _check_key("counts_key", self.counts_key)
        for name in ("batch_index_key", "counts_key"):
            if getattr(self, name) in fields:
                msg = f"{name}={getattr(self, name)!r} is also in fields; pick another name"
                raise ValueError(msg)
        if self.batch_index_key is not None and self.batch_index_key == self.counts_key:
            msg = f"batch_index_key and counts_key must differ, both are {self.counts_key!r}"
            raise ValueError(msg)
        if self.batch_index_key is None and self.counts_key is None and not prepend:
            msg = (
                "RaggedCollate needs batch_index_key, counts_key or prepend_batch_index to "
                "keep track of which rows belong to which sample; all are unset"
            )
            raise ValueError(msg)

    def __call__(self, batch: Sequence[Any]) -> Any:
        samples, keys, is_dict = _split_samples(batch, "RaggedCollate")
        where = "the samples' keys" if is_dict else "the tuple positions"
        for k in self.fields:
            if k not in keys:
                msg = f"RaggedCollate(fields=...) names {k!r}, which is not one of {where} {keys}"
                raise CollateError(msg)
        for name in ("batch_index_key", "counts_key"):
            key = getattr(self, name)
            if is_dict and key is not None and key in keys:
                msg = (
                    f"the samples already have a field {key!r}, where RaggedCollate puts "
                    f"the {name[:-4].replace('_', ' ')}; pass {name}=None or another name"
                )
                raise CollateError(msg)
        n = len(samples)
        out: dict[Any, Any] = {}
        counts: np.ndarray | None = None
        first_field = None
        index_torch = False
        for k in self.fields:
            with _at(*_seg(k, is_dict)):
                arrays, is_torch, dtype = _as_arrays([s[k] for s in samples], "RaggedCollate", 1)
                # an empty 1-D array (np.array([])) means "no rows", whatever the row shape
                arrays = [None if a is not None and tuple(a.shape) == (0,) else a for a in arrays]
                rest = _check_other_dims(arrays, 0, "RaggedCollate") or ()
                if dtype is None:
                    dtype = np.dtype(np.int64)
                field_counts = np.array(
                    [0 if a is None else a.shape[0] for a in arrays], dtype=np.int64
                )
                if counts is None:
                    counts, first_field, index_torch = field_counts, k, is_torch
                else:
                    for i in np.flatnonzero(field_counts != counts):
                        msg = (
                            f"RaggedCollate: sample {i} has {counts[i]} rows in "
                            f"{_format_path((_seg(first_field, is_dict),))} but "
                            f"{field_counts[i]} in {_field()}; the fields of one sample must "
                            f"have one row per object."
                        )
                        raise CollateError(msg)
                prepend = k in (self.prepend_batch_index or ())
                if prepend and len(rest) != 1:
                    msg = (
                        f"RaggedCollate can prepend the batch index only to 2-D fields, but "
                        f"{_field()} has rows of shape {rest}"
                    )
                    raise CollateError(msg)
                out[k] = self._concat(arrays, counts, is_torch, dtype, rest, prepend)
        if counts is None:
            raise AssertionError("RaggedCollate: no field was concatenated")
        for k in keys:
            if k not in out:
                with _at(*_seg(k, is_dict)):
                    out[k] = collate([s[k] for s in samples], collate_fn_map=default_collate_fn_map)
        extras = []
        if self.batch_index_key is not None:
            index = _empty((int(counts.sum()),), np.int64)
            index[:] = np.repeat(np.arange(n, dtype=np.int64), counts)
            extras.append((self.batch_index_key, _to_output(index, index_torch)))
        if self.counts_key is not None:
            extras.append((self.counts_key, _to_output(_finish(counts), index_torch)))
        return _assemble(out, keys, is_dict, extras)

    @staticmethod
    def _concat(
        arrays: list[Any],
        counts: np.ndarray,
        is_torch: bool,
        dtype: Any,
        rest: tuple[int, ...],
        prepend: bool,
    ) -> Any:
        total = int(counts.sum())
        width = (rest[0] + 1,) if prepend else rest
        rows = [a for a in arrays if a is not None and a.shape[0]]
        index = np.repeat(np.arange(len(arrays)), counts)
        if is_torch:
            torch = _torch()
            out = _torch_alloc((total, *width), dtype)
            if out is None:
                out = torch.empty((total, *width), dtype=dtype)
            if prepend:
                out[:, 0] = torch.from_numpy(index).to(dtype)
                if rows:
                    out[:, 1:] = torch.cat(rows, 0)
            elif rows:
                torch.cat(rows, 0, out=out)
            return out
        out_np = _empty((total, *width), dtype)
        body_np = out_np[:, 1:] if prepend else out_np
        if rows:
            np.concatenate(rows, axis=0, out=body_np)
        if prepend:
            out_np[:, 0] = index
        return out_np
