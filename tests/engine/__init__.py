"""Tests of stoker.engine; engine_datasets.py holds the datasets that worker processes unpickle."""
