"""torch-neuronx's experimental API: the profiler."""

from . import profiler

__all__ = ["profiler"]
