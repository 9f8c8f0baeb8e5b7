"""An example device plugin for accel-backends (see plugin.py)."""
