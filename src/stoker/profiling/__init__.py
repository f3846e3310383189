"""Where the time goes: per-stage loader statistics and the training-loop profiler."""

from stoker.profiling.profiler import Profile, profile
from stoker.profiling.stats import LoaderStats

__all__ = ["LoaderStats", "Profile", "profile"]
