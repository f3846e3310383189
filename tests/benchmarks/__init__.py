"""Smoke runs of the scripts in benchmarks/, so that they keep running as stoker changes."""
