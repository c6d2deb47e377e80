"""gpushift: time-share one GPU host between inference servers on a schedule."""

__version__ = "0.1.0"
