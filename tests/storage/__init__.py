"""Tests of stoker.storage: readers over a real S3-compatible server on 127.0.0.1."""
