"""A tiny Qwen2.5-Instruct-like model directory, written in code (no downloads): ``accel-grpo make-tiny-model DIR``.

It has what real instruction-tuned checkpoints have and the built-in character model does not: a byte-level BPE
``tokenizer.json`` with the ``<|im_start|>``/``<|im_end|>``/``<|endoftext|>`` special tokens, a chat template,
a ``generation_config.json`` with several EOS ids and its own sampling settings (which a rollout must not
inherit), and ``model.safetensors`` weights. The weights are random except that the EOS tokens are made likely
(by default both together about 4% per token), so responses end at an EOS as real ones do. ``eos_bias`` sets how
likely (lower: longer responses; ``make-tiny-model --eos-bias``), ``single_eos`` keeps ``<|im_end|>`` as the only
EOS id everywhere (a peer such as TRL stops at the tokenizer's EOS only: a fair comparison needs one id).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen-style, with tools: the tool schemas go into the system message, an assistant's tool calls are rendered as
# <tool_call>{json}</tool_call>, consecutive tool results form one user turn of <tool_response> blocks. Without
# tools and tool messages it renders exactly as a plain ChatML template. Prefix-preserving: appending messages
# never changes the text of earlier ones (what a multi-turn rollout needs, engine/rollout/multi_turn/template.py).
_TOOLS_BLOCK = (
    "{% if tools %}{{ '\\n\\n' }}# Tools\nYou can call these functions (JSON schemas):\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n"
    "To call one, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>; each result comes "
    "back inside <tool_response></tool_response>.{% endif %}"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    + _TOOLS_BLOCK + "<|im_end|>\n{% endif %}"
    "{% if message['role'] == 'system' %}<|im_start|>system\n{{ message['content'] }}" + _TOOLS_BLOCK
    + "<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# What Qwen2.5-Instruct ships, and what a rollout must override: sampling settings and a repetition penalty.
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}

_WORDS = ("the a an of to and in is are was were has have had how many much more less than each every total "
          "apples oranges books pencils dollars minutes hours days friends students cookies marbles cars trees "
          "she he they buys sells gives takes eats reads writes works spends saves earns shares left remaining "
          "what after before then finally answer question step think let us so therefore because first second "
          "twice half double triple per week month year price cost money bag box basket garden school shop "
          "Janet Tom Maria James Lee Sam Ana Omar bakes plants collects runs walks drives miles pages").split()


def corpus(lines: int = 3000, seed: int = 0) -> list[str]:
    """GSM8K-flavoured sentences with numbers: enough text for a few thousand BPE merges."""
    rng = random.Random(seed)
    text = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.randint(0, 2000)) for _ in range(14)]
        text.append(" ".join(words) + rng.choice(("?", ".", "!", " #### " + str(rng.randint(0, 500)))))
    return text


def build_tokenizer(vocab_size: int = 2048):
    """A byte-level BPE trained on ``corpus()``, wrapped as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_model(directory, *, hidden_size: int = 64, layers: int = 2, vocab_size: int = 2048,
                    generation: dict | None = None, chat_template: bool = True, seed: int = 0,
                    eos_bias: float = 0.5, single_eos: bool = False) -> Path:
    """Write the model directory and return its path. ``generation`` overrides ``generation_config.json`` keys.

    ``eos_bias``: the weight by which each EOS row of the output layer reads the constant embedding feature, i.e.
    how far each EOS logit stands above the others (0.5: both EOS ids together about 4% per token; 0: no boost).
    """
    import torch
    from transformers.utils import logging

    from .tiny_model import tiny_qwen2

    logging.disable_progress_bar()  # a "Writing model shards" bar for a file of a few MiB is noise
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    if not chat_template:
        tokenizer.chat_template = None
    tokenizer.save_pretrained(directory)
    eos_tokens = ("<|im_end|>",) if single_eos else ("<|im_end|>", "<|endoftext|>")
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in eos_tokens]

    model = tiny_qwen2(seed=seed, vocab_size=len(tokenizer), hidden_size=hidden_size, layers=layers,
                       max_positions=1024, bos_token_id=None, eos_token_id=eos_ids,
                       pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        # A constant feature in every embedding survives the final RMSNorm as a large positive value; the EOS rows
        # of the output layer read it, so each EOS gets a logit a few units above the others at every position.
        model.model.embed_tokens.weight[:, 0] = 1.0
        for eos in eos_ids:
            model.lm_head.weight[eos, 0] = eos_bias
    model.save_pretrained(directory, safe_serialization=True)
    # Written as JSON, as found in model repositories (HF's own writer refuses some combinations, e.g. greedy
    # decoding with sampling settings, which real repositories nevertheless ship).
    generation_config = {**GENERATION_DEFAULTS, **(generation or {}), "eos_token_id": eos_ids,
                         "pad_token_id": tokenizer.pad_token_id}
    (directory / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    (directory / "README.md").write_text("Tiny random Qwen2.5-Instruct-like model written by "
                                         "engine.demo_model.make_tiny_model (accel-grpo make-tiny-model).\n")
    return directory

