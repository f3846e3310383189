"""Tests of stoker.streams: shuffle buffers, bucketing, mixing, and stream resume."""
