"""A sequence-classification reward model written in code for the echo task (no downloads, no training): its
score is high when a response ends with the letter ``a`` and about 0 otherwise, so GRPO with it as the reward must
learn to end responses with ``a``. Its layers add nothing (attention and MLP outputs zeroed), so the score head
reads the normalised embedding of the last token: ``score = 4 * [last token is 'a'] * sqrt(hidden)/...``."""

from __future__ import annotations

from pathlib import Path

LIKED = "a"


def make_reward_model(directory: Path, hidden: int = 32) -> Path:
    import torch
    from transformers import Qwen2ForSequenceClassification

    from engine.rl.prompts import EchoTask
    from engine.rl.tokenizer import build_char_tokenizer
    from engine.tiny_model import tiny_qwen2_config

    tokenizer = build_char_tokenizer(EchoTask.alphabet)
    config = tiny_qwen2_config(vocab_size=len(tokenizer), hidden_size=hidden, layers=1, heads=2, kv_heads=1,
                               num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        embeddings.normal_(0.0, 0.02)
        embeddings[:, 0] = 0.0
        embeddings[tokenizer.convert_tokens_to_ids(LIKED), 0] = 1.0  # 'a' points along dimension 0 only
        model.model.norm.weight.fill_(1.0)
        model.score.weight.zero_()
        model.score.weight[0, 0] = 1.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def expected_score(text: str, hidden: int = 32) -> float:
    """What the model gives ``text`` (prompt + response), up to the other dimensions' tiny share of the norm."""
    return hidden ** 0.5 if text.endswith(LIKED) else 0.0
