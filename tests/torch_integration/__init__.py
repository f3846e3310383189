"""Tests of stoker.torch (not tests/torch: a package of that name would shadow torch)."""
