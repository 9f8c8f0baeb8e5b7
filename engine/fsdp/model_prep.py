"""Model preparation before sharding: the attention implementation, PEFT LoRA and gradient checkpointing."""

from __future__ import annotations

import torch.nn as nn

from ..config import EngineConfig


def is_peft_model(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def use_attention(model: nn.Module, implementation: str | None) -> None:
    """Switch a Hugging Face model (PEFT-wrapped or not) to ``implementation``; other modules are left as they are."""
    if implementation is None:
        return
    target = model.get_base_model() if is_peft_model(model) else model
    setter = getattr(target, "set_attn_implementation", None)
    current = getattr(getattr(target, "config", None), "_attn_implementation", None)
    if callable(setter) and current != implementation:
        setter(implementation)


def prepare_model(model: nn.Module, config: EngineConfig, attn_implementation: str | None = None) -> nn.Module:
    """Set the attention implementation, apply LoRA when asked (unless the model already is a PEFT model) and
    gradient checkpointing."""
    use_attention(model, attn_implementation)
    if config.lora_rank > 0 and not is_peft_model(model):
        from peft import LoraConfig, get_peft_model

        targets = config.lora_target_modules
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=targets if isinstance(targets, str) else list(targets),
            bias="none",
        )
        model = get_peft_model(model, lora)
    if config.gradient_checkpointing:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(f"gradient_checkpointing needs a Hugging Face model; {type(model).__name__} has no "
                             "gradient_checkpointing_enable()")
        # Non-reentrant checkpointing works with FSDP and with frozen (LoRA) inputs.
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if is_peft_model(model):
            model.enable_input_require_grads()
    return model
