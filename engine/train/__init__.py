"""What every trainer's run shares, whatever it trains: the config pipeline (``config.py``), the run directory and
resume (``run_dir.py``), worker counts (``workers.py``), checkpoint retention (``retention.py``), loggers
(``loggers.py``), the metrics file and curves (``report.py``), the progress bar (``progress.py``) and the export of a
checkpoint as a Hugging Face model (``export.py``). GRPO (``engine/grpo/``) and SFT (``engine/sft/``) both build on
it; it imports neither.
"""
