"""The model an offline run trains (SFT, DPO, a reward model): a local Hugging Face directory, or the demos' tiny
Qwen2.5-like model (``model.path=builtin:tiny-chat``), which is written once (``engine.demo_model.make_tiny_model``)
under ``run.output_dir`` and then used like any directory."""

from __future__ import annotations

import os
from pathlib import Path

DEMO_MODEL = "builtin:tiny-chat"  # a tiny Qwen2.5-like model directory, written on first use (engine.demo_model)


def demo_model_dir(config) -> Path:
    """Write the demo model (atomically: every torchrun worker may get here) and return its directory."""
    from transformers.utils import logging

    from ..demo_model import make_tiny_model

    logging.disable_progress_bar()
    m = config.model
    directory = Path(config.run.output_dir) / ".models" / f"tiny-chat-h{m.hidden_size}-l{m.layers}"
    if not (directory / "model.safetensors").is_file():
        partial = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
        make_tiny_model(partial, hidden_size=m.hidden_size, layers=m.layers, vocab_size=1024, eos_bias=0.0,
                        single_eos=True)
        try:
            partial.rename(directory)
        except OSError:  # another process wrote it first
            import shutil

            shutil.rmtree(partial, ignore_errors=True)
    return directory


def resolve_model_path(config) -> None:
    """``model.path=builtin:tiny-chat`` becomes the demo model's directory (config.json records the real path)."""
    if config.model.path == DEMO_MODEL:
        config.model.path = str(demo_model_dir(config))


def load_tokenizer(path: str):
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
