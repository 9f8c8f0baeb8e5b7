"""Model directories for the distillation tests: the built-in character model (its tokenizer and architecture) at a
chosen size and seed, written as a Hugging Face directory; ``sharpness`` scales the output layer so the model's
next-token distribution is peaked (a teacher with something to teach); ``alphabet`` another tokenizer."""

from __future__ import annotations

from pathlib import Path


def char_model_dir(directory: Path, *, hidden: int = 32, layers: int = 1, seed: int = 0, sharpness: float = 1.0,
                   alphabet: str | None = None) -> str:
    import torch

    from engine.rl.prompts import EchoTask
    from engine.rl.tokenizer import build_char_tokenizer
    from engine.tiny_model import tiny_qwen2

    tokenizer = build_char_tokenizer(alphabet or EchoTask.alphabet)
    model = tiny_qwen2(seed=seed, vocab_size=len(tokenizer), hidden_size=hidden, layers=layers,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
