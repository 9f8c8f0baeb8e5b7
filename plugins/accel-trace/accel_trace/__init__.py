"""Timeline of an engine's events per rank, for Perfetto / chrome://tracing (see plugin.py and timeline.py)."""
