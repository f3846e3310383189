"""Merging a list of samples into one batch.

The registry works like ``torch.utils.data``'s: :data:`default_collate_fn_map` maps an
element type (or a tuple of types) to a function ``fn(batch, *, collate_fn_map)``, and
:func:`collate` dispatches on the type of the batch's first element (exact type first,
then ``isinstance`` over the map in order), recursing into mappings, namedtuples and
sequences. :func:`default_collate` is :func:`collate` with the default map; its output
is numpy (torch tensors stay torch tensors). :mod:`stoker.torch` converts to tensors.

On top of it sit two collates for variable-size data: :class:`PadCollate` /
:func:`pad_collate` pad sequences to the batch maximum and add a mask and lengths, and
:class:`RaggedCollate` concatenates variable-count fields (detection boxes) and adds a
batch index.

The pieces: ``_registry`` holds the registry, the dispatcher, the default collates and
:func:`collate_into`; ``padding`` holds PadCollate; ``ragged`` holds RaggedCollate;
``_fields`` the helpers those two share. ``padding``, ``ragged`` and ``_fields`` import
``_registry`` (and ``_fields``), never this package, so nothing imports in a circle.

Every numpy array these functions create for a batched field can be written straight
into memory someone else owns (a shared-memory slot) with :func:`collate_into`.

Errors name the field inside the sample (``sample['image']``, ``sample[1]``,
``sample['meta']['boxes']``) and the samples that disagree; they raise
:class:`~stoker.CollateError`, a ``TypeError``.
"""

from __future__ import annotations

from stoker.collate._registry import (
    collate,
    collate_into,
    default_collate,
    default_collate_fn_map,
    default_convert,
    register_collate,
)
from stoker.collate.padding import PadCollate, pad_collate
from stoker.collate.ragged import RaggedCollate

# Named where they are imported from, so that help(), docs and pickles say stoker.collate.
for _function in (collate, collate_into, default_collate, default_convert, register_collate):
    _function.__module__ = __name__
del _function

__all__ = [
    "PadCollate",
    "RaggedCollate",
    "collate",
    "collate_into",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "pad_collate",
    "register_collate",
]
