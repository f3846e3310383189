"""Packed shards: many small records in a few large files, read through ``mmap``.

Millions of small files make random reads slow (an open, a stat and a seek per sample)
and defeat the page cache's readahead. Packing appends the records to a few large shard
files with an index of offsets, lengths and crc32 checksums, and reads them back as views
of a memory mapping. Pair :class:`PackedDataset` with
:class:`stoker.BlockShuffleSampler` to keep the reads of an epoch close together on disk.

- :class:`PackedWriter` streams records into shards and finishes atomically.
- :class:`PackedDataset` is a map-style dataset over the result.
- ``stoker pack SRC DST`` packs an image folder or a list of files.

The layout is specified in docs/packed-format.md: every file is a standard ``.npy`` or
JSON file, readable with numpy alone.

Example:
    >>> import tempfile
    >>> from stoker.formats.packed import PackedDataset, PackedWriter
    >>> folder = tempfile.mkdtemp()
    >>> with PackedWriter(folder, max_shard_bytes=8) as writer:
    ...     for word in (b"alpha", b"beta", b"gamma"):
    ...         _ = writer.add(word)
    >>> ds = PackedDataset(folder, verify="read")
    >>> [bytes(ds[i]) for i in range(len(ds))], len(ds.shard_paths)
    ([b'alpha', b'beta', b'gamma'], 3)
"""

from __future__ import annotations

from stoker.formats._packed_spec import FORMAT_VERSION, PackedFormatError
from stoker.formats.packed_reader import PackedDataset
from stoker.formats.packed_writer import DEFAULT_SHARD_BYTES, PackedWriter

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "FORMAT_VERSION",
    "PackedDataset",
    "PackedFormatError",
    "PackedWriter",
]
