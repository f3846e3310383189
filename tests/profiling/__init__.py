"""Tests of stoker.profiling: loader statistics, the profiler, autotuning."""
