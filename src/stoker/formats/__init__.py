"""Datasets over data on disk: packed shards, image folders, text and tar shards.

One module per format; import from the module (``from stoker.formats.packed import
PackedDataset``) or from here once re-exported.
"""
