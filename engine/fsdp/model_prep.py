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


def apply_lora(model: nn.Module, config: EngineConfig) -> nn.Module:
    """``model`` wrapped by PEFT LoRA as ``config`` asks (``lora_rank`` > 0); the same wrapping an export rebuilds."""
    from peft import LoraConfig, get_peft_model

    targets = config.lora_target_modules
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
    )
    return get_peft_model(model, lora)


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
        model = apply_lora(model, config)
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


def lora_config(model: nn.Module):
    """The active LoRA adapter's name and PEFT ``LoraConfig``, or None."""
    for module in model.modules():
        configs = getattr(module, "peft_config", None)
        if isinstance(configs, dict) and configs:
            return next(iter(configs.items()))
    return None


def lora_adapter(model: nn.Module) -> tuple[str, float] | None:
    """The active LoRA adapter's name and scaling (``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA), or None."""
    found = lora_config(model)
    if found is None:
        return None
    name, config = found
    return name, config.lora_alpha / (config.r ** 0.5 if config.use_rslora else config.r)
