"""Models, micro-batches and step functions of the sequence-parallel parity tests (importable by spawned ranks)."""

import torch

from accel_backends.testing.strict import StrictBackend

VOCAB = 96
LENGTHS = [([12, 9, 15], [5, 3, 11]), ([19, 7], [9, 2])]  # per micro-batch: sequence lengths, first scored token
ONE_SEQUENCE = [([37], [4])]  # one row, positions never restart: plain causal attention after the exchange


class CountingBackend(StrictBackend):
    """The strict stand-in device (a device's rules on the CPU: no float64 reductions, host copies landing at
    synchronize()), counting the all-to-alls the exchange asks it for."""

    exchanges = 0

    def all_to_all(self, output, input, group=None):
        self.exchanges += 1
        super().all_to_all(output, input, group)


def build_model(family: str, kv_heads: int = 2, lora: bool = False):
    """A tiny random model of ``family`` (qwen2, llama, qwen3), 4 attention heads; the same weights every call."""
    import transformers

    torch.manual_seed(1234)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                  tie_word_embeddings=False)
    config = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
              "qwen3": lambda **kw: transformers.Qwen3Config(head_dim=16, **kw)}[family](**common)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules="all-linear",
                                                 init_lora_weights=False))
    return model


def layouts(packed: bool, seed: int = 7, shapes=LENGTHS):
    """Two micro-batches of variable-length sequences (prompt + scored part) as ``engine.packing`` layouts."""
    from engine.packing import SequenceBatch, build_layout

    g = torch.Generator().manual_seed(seed)
    out = []
    for lengths, starts in shapes:
        tokens = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=g)
        batch = SequenceBatch(tokens, torch.tensor(lengths), torch.tensor(starts))
        out.append(build_layout(batch, list(range(len(lengths))), packed=packed))
    return out


def layout_loss(module, layout, sp):
    """Token-mean negative log-likelihood of the scored tokens: this rank's share; weight: the micro-batch's."""
    from engine.sequence_parallel import slice_log_probs, split_layout, token_mean_share

    device = next(module.parameters()).device
    piece = split_layout(layout, sp).to(device)
    log_probs, _ = slice_log_probs(module, piece)
    return token_mean_share(-log_probs, piece), layout.targets.numel()


def plain_batches(seed: int = 3):
    """Left-padded rows with labels (-100 on the first tokens: a prompt), as ``generate`` leaves them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :6], mask[2, :2] = 0, 0
    labels = ids.masked_fill(torch.arange(21) < 8, -100)
    return [{"input_ids": ids, "attention_mask": mask, "labels": labels}]


def plain_loss(module, batch, sp):
    """Mean cross-entropy of the scored labels through ``split_inputs`` (labels shifted before the cut)."""
    from engine.sequence_parallel import split_inputs

    device = next(module.parameters()).device
    inputs, targets = split_inputs(batch["input_ids"], batch["labels"], sp, attention_mask=batch["attention_mask"])
    inputs = {k: v.to(device) for k, v in inputs.items()}
    logits = module(**inputs, use_cache=False).logits.float()
    total = int((batch["labels"][:, 1:] != -100).logical_and(batch["attention_mask"][:, 1:] == 1).sum())
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1).to(device),
                                             ignore_index=-100, reduction="sum")
    return loss / total, total


def _trainer_module(trainer: str, name: str):
    """A trainer's module, where the recipes live (``engine.recipes.<trainer>``) or where they were."""
    import importlib

    try:
        return importlib.import_module(f"engine.recipes.{trainer}.{name}")
    except ImportError:
        return importlib.import_module(f"engine.{trainer}.{name}")


def grpo_log_prob_loss(module, layout, sp):
    """GRPO's own chunked log-probs (fused output layer, several checkpointed slices, entropy at temperature 0.7)
    on this rank's slice, as a trainer will call them: the slice is a ``Layout``."""
    from engine.sequence_parallel import split_layout

    logprobs = _trainer_module("grpo", "logprobs")

    logprobs.ROWS_PER_SLICE = 5
    piece = split_layout(layout, sp).to(next(module.parameters()).device)
    log_probs, entropy = logprobs.sequence_log_probs(module, piece, 0.7, with_entropy=True)
    mask = piece.scored_mask.to(log_probs.device)
    loss = -(log_probs * mask).sum() / layout.targets.numel()
    return loss, layout.targets.numel(), {"entropy": (entropy * mask).sum() / layout.targets.numel()}


def sft_token_loss(module, layout, sp):
    """SFT's own chunked cross-entropy on this rank's slice (a rank without scored tokens adds a zero)."""
    from engine.sequence_parallel import split_layout, token_mean_share

    sft_loss = _trainer_module("sft", "loss")

    sft_loss.ROWS_PER_CHUNK = 4
    piece = split_layout(layout, sp).to(next(module.parameters()).device)
    losses, hits = sft_loss.per_token_losses(module, piece)
    return token_mean_share(losses, piece), layout.targets.numel(), {"accuracy": token_mean_share(hits.float(), piece)}
