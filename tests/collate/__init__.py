"""Tests of stoker.collate: the default collate and its registry, padding, ragged fields, torch tensors."""
