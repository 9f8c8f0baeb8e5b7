"""Intel GPU (XPU) backend for accel-backends (see plugin.py)."""
