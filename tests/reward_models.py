"""A sequence-classification reward model written in code for the echo task (no downloads, no training): it
scores the share of the letter ``a`` in what it reads (prompt, response and the EOS after it), so GRPO with it as
the reward must learn to write ``a``. Its attention is uniform (query and key weights zeroed) and carries one
feature, "this token is an a", to the last position; its MLP adds nothing; the score head reads that feature after
the final norm, against a constant feature every token has, so the score rises with the share of ``a``."""

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
                               num_labels=1, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 1] = 1.0  # every token: a constant feature, so the norms do not undo the share
        embeddings[tokenizer.convert_tokens_to_ids(LIKED), 0] = 1.0  # "this token is an a"
        for norm in (model.model.norm, *(m for layer in model.model.layers
                                         for m in (layer.input_layernorm, layer.post_attention_layernorm))):
            norm.weight.fill_(1.0)
        attention = model.model.layers[0].self_attn  # q = k = 0: each position averages the values before it
        attention.v_proj.weight[0, 0] = 1.0
        attention.o_proj.weight[0, 0] = 1.0
        model.score.weight[0, 0] = 1.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
