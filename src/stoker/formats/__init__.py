"""Datasets over data on disk: packed shards, image folders, text and tar shards.

One module per format: ``packed`` (checksummed shards read through mmap), ``image_folder``
(one subfolder per class), ``text`` (lines and JSON lines) and ``tar`` (WebDataset-style
shards). The common names are re-exported here.
"""

from stoker.formats.image_folder import ImageFolder
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.formats.tar import TarShards
from stoker.formats.text import JsonLines, TextLines

__all__ = ["ImageFolder", "JsonLines", "PackedDataset", "PackedWriter", "TarShards", "TextLines"]
