"""Tests of stoker.vision: decoding and transforms."""
