"""Tests of stoker.collate: default collate and registry, padding, ragged fields, tensors."""
