"""gpuhost-agent: the host-side agent of a GPU rental marketplace."""

__version__ = "0.1.0"
