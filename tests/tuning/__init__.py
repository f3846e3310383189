"""Tests of stoker.tuning: the sweep, its knee and its measurements."""
