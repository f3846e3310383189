"""The exceptions stoker raises.

Every error stoker raises on purpose derives from :class:`StokerError`, and also from
the builtin exception a torch user would catch for the same mistake, so that code
written against ``torch.utils.data`` keeps working::

    StokerError (Exception)
    ├── CollateError (StokerError, TypeError)     a batch cannot be collated
    ├── DatasetError (StokerError)               a dataset is malformed
    │   ├── DatasetIndexError (DatasetError, IndexError)  an index is out of range
    │   ├── ImageDecodeError (DatasetError, ValueError)   bytes are not a readable image
    │   └── PackedFormatError (DatasetError)              a packed dataset is damaged
    ├── MissingExtraError (StokerError, ModuleNotFoundError)  an optional package is missing
    ├── TooManyBadSamples (StokerError)          more samples failed than max_errors allows
    ├── WorkerError (StokerError, RuntimeError)   a worker died, hung or misbehaved
    └── ShmError (StokerError, OSError)           shared memory is missing or too small

Each is importable from ``stoker`` itself, and tracebacks name it there
(``stoker.CollateError``). Argument mistakes raise plain ``ValueError`` or ``TypeError``
with a message that names the argument, the value received, and what to pass instead.
"""

from __future__ import annotations

__all__ = [
    "CollateError",
    "DatasetError",
    "DatasetIndexError",
    "ImageDecodeError",
    "MissingExtraError",
    "PackedFormatError",
    "ShmError",
    "StokerError",
    "TooManyBadSamples",
    "WorkerError",
]


class StokerError(Exception):
    """Base class of every error that stoker raises on purpose."""


class CollateError(StokerError, TypeError):
    """A list of samples could not be merged into a batch.

    The message names the field path inside the sample (for example
    ``sample['image']`` or ``sample[1]``) and the shapes or types that disagree.
    """


class DatasetError(StokerError):
    """A dataset is malformed (mismatched lengths, wrong types)."""


class DatasetIndexError(DatasetError, IndexError):
    """An index is outside a dataset's range."""


class ImageDecodeError(DatasetError, ValueError):
    """Encoded bytes could not be decoded as an image; the message names the file.

    Raised by :func:`stoker.vision.decode_image`, it also has ``filename`` (the file, or
    None for bytes of no file) and ``reason`` (what the decoder said).
    """


class PackedFormatError(DatasetError):
    """A packed dataset is incomplete, truncated, corrupted or not a packed dataset.

    The message names the file and, where one is at fault, the record.
    """


class TooManyBadSamples(StokerError):
    """More samples failed than ``max_errors`` allows; the message summarises them."""


class WorkerError(StokerError, RuntimeError):
    """A loader worker died, timed out, or reported an error it could not carry."""


class ShmError(StokerError, OSError):
    """Shared memory (``/dev/shm``) is missing or too small for the slot pool."""


class MissingExtraError(StokerError, ModuleNotFoundError):
    """An optional package is missing; the message names the extra that installs it.

    A :class:`ModuleNotFoundError` (so an ``ImportError``), with ``name`` the module.
    """


# Users import these from ``stoker``; tracebacks and reprs name them there too. Pickling
# (a worker's exception sent to the trainer) finds them there as well.
for _error in (
    CollateError,
    DatasetError,
    DatasetIndexError,
    ImageDecodeError,
    MissingExtraError,
    PackedFormatError,
    ShmError,
    StokerError,
    TooManyBadSamples,
    WorkerError,
):
    _error.__module__ = "stoker"
del _error
