"""Tests of stoker.samplers."""
