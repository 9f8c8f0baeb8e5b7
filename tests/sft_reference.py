"""The SFT exactness tests' data and their one-process reference (importable by spawned ranks): conversations of
varied lengths, and the loss, metrics and gradients of one plain process computing the whole global batch at once
in one padded forward, which a split run (several ranks, micro-batches, sequence parallelism) must reproduce."""

import dataclasses

WORDS = "apples books pencils dollars minutes hours friends cookies marbles trees garden school".split()


def conversation(index: int) -> list[dict]:
    """One or two assistant turns, 1 to 6 words reversed."""
    words = [WORDS[(index * 5 + k) % len(WORDS)] for k in range(1 + index % 6)]
    messages = [{"role": "user", "content": "reverse: " + " ".join(words)},
                {"role": "assistant", "content": " ".join(reversed(words))}]
    if index % 3 == 0:
        messages += [{"role": "user", "content": "again"}, {"role": "assistant", "content": words[0]}]
    return messages


def tokenized(tokenizer, index: int, name: str | None = None):
    """Conversation ``index`` tokenized as SFT does, the loss on the assistant turns."""
    from engine.offline.masks import tokenize_example
    from engine.offline.messages import Example

    return tokenize_example(Example(name or f"t:{index}", messages=conversation(index)), tokenizer, "assistant")


def full_grads(module) -> dict:
    """Every gradient as a full tensor (FSDP2's DTensors gathered), by parameter name."""
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in module.named_parameters() if p.grad is not None}


def relative_error(got: dict, want: dict) -> float:
    """Over all gradients together: |got - want| / |want| (per parameter it is meaningless for those whose true
    gradient is zero, such as the key biases: softmax ignores a shift shared by all keys)."""
    assert sorted(got) == sorted(want)
    difference = sum(float((got[k] - want[k]).double().norm() ** 2) for k in want) ** 0.5
    return difference / grad_norm(want)


def grad_norm(grads: dict) -> float:
    return sum(float(g.double().norm() ** 2) for g in grads.values()) ** 0.5


@dataclasses.dataclass
class Reference:
    """The whole global batch on one plain fp32 process: what each split run is compared with."""

    tokenizer: object
    model: object  # the reference model, its gradients filled
    items: list  # the tokenized conversations, in order
    loss: float
    tokens: float  # supervised tokens
    accuracy: float
    grads: dict


def reference(model_dir: str, count: int) -> Reference:
    """Conversations 0..count-1 in one padded forward and backward, the loss SFT's own ``token_loss``."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.offline.model_files import load_tokenizer
    from engine.offline.objectives.sft.trainer import token_loss
    from engine.offline.sequences import MicroBatch, sequence_batch
    from engine.packing import build_layout

    tokenizer = load_tokenizer(model_dir)
    items = [tokenized(tokenizer, i) for i in range(count)]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch, masks = sequence_batch(items)
    layout = build_layout(batch, list(range(len(items))), packed=False)
    whole = MicroBatch(layout, masks[layout.rows, batch.starts[layout.rows] + layout.columns])
    loss, tokens, metrics = token_loss(model, whole, torch.device("cpu"))
    loss.backward()
    return Reference(tokenizer, model, items, loss.item(), tokens.item(), float(metrics["mean_token_accuracy"]),
                     full_grads(model))
